"""Recipes for the calc main job's GRPO phase, each one config switch, seed by seed, from one shared warm start.

Run from the repo root (each variant run: about the main job's GRPO phase, ~25 min on 2 idle cores):

    PYTHONPATH=. .venv/bin/python tutorials/recipes/run.py --arms reference,lora,kl,replay --seeds 0,1,2
    PYTHONPATH=. .venv/bin/python tutorials/recipes/run.py --quick --arms reference,lora --seeds 0   # a try

Stages, each a plain ``spanlab train`` config written to ``OUT/configs/NAME.yaml`` (the main job,
``tutorials/calc/grpo.yaml``, deep-merged with ``tutorials/recipes/arms/ARM.yaml``), run in a subprocess with its
own store ``OUT/NAME.duckdb`` (`tutorials/stages.py`):

1. ``start``: the main job's SFT warm start and its evaluation (phase ``warm_start``), no GRPO step; its
   ``OUT/start/final/`` is every variant's model. Seeded with ``rollouts.seed: 0``.
2. ``ARM-sN`` for each arm and seed: the main job's GRPO from ``OUT/start/final`` with ``rollouts.seed: N``, the
   start's train tasks and no evaluation of its own start (the start's is every run's). Arms of one seed share
   their sampling seeds, so two arms differ by their switch, not by their luck.
3. ``--sealed``: the sealed split (``dataset`` split ``sealed``, wordings from another hand, pinned by digest) on
   the start and on the named runs' ``final/``, each an evaluation-only stage ``sealed-NAME`` (phase ``base``). The
   sealed split checks a recipe already chosen on the other splits; it is never used to choose one, and each look
   is logged in ``docs/results.md`` ("The sealed split").

A finished stage is reused; ``--resume`` continues a stopped one. At the end it prints the ``spanlab compare``
command for the table.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spanlab.config import load_yaml  # noqa: E402
from spanlab.errors import ConfigError  # noqa: E402
from tutorials.stages import deep_merge, from_checkpoint, run_stage, start_train_tasks  # noqa: E402

logger = logging.getLogger("recipes")

HERE = Path(__file__).resolve().parent
BASE = ROOT / "tutorials" / "calc" / "grpo.yaml"
QUICK_BASE = ROOT / "tutorials" / "calc" / "quick.yaml"
ARMS = tuple(sorted(p.stem for p in (HERE / "arms").glob("*.yaml") if p.stem != "start"))
# The sealed split's evaluation: levels 1-3 (one step: levels 1-2; two steps: level 3), greedy.
SEALED_TASKS = 150


def stage_config(name: str, base: dict[str, Any], out: Path, train_tasks: int) -> dict[str, Any]:
    """The full train config of stage ``start`` or ``ARM-sN``."""
    arm, seed = ("start", 0) if name == "start" else (name.rsplit("-s", 1)[0], int(name.rsplit("-s", 1)[1]))
    config = deep_merge(base, load_yaml(HERE / "arms" / f"{arm}.yaml") or {})
    config.update(run_name=name, out_dir=str(out), db=str(out / f"{name}.duckdb"))
    config["rollouts"] = {**config.get("rollouts", {}), "seed": seed}
    if name == "start":
        return config
    config = from_checkpoint(config, out / "start" / "final", train_tasks)
    config["eval"] = {**config.get("eval", {}), "base": False}
    return config


def sealed_config(run: str, base: dict[str, Any], out: Path, tasks: int) -> dict[str, Any]:
    """An evaluation-only stage: ``OUT/RUN/final`` on the sealed split and test (phase ``base``), nothing trained."""
    config = from_checkpoint(deep_merge(base, {}), out / run / "final", 0)
    name = f"sealed-{run}"
    config.update(run_name=name, out_dir=str(out), db=str(out / f"{name}.duckdb"))
    config["dataset"].pop("train_tasks", None)
    config["eval"] = {"split": "test", "extra_splits": ["sealed"], "levels": [1, 2, 3], "tasks": tasks,
                      "temperature": 0.0, "base": True}  # the headline split must be val or test: test comes along
    config["grpo"] = {**config.get("grpo", {}), "steps": 0}
    config["grpo"].pop("demonstrations", None)
    config["checkpoints"] = {"final": False}
    config["rollouts"] = {**config.get("rollouts", {}), "seed": 0}
    return config


def compare_command(out: Path, arms: list[str], seeds: list[int], *, pool: bool = True) -> str:
    """The table's command; ``pool``: also levels 1-3 pooled over test and family (the main job evaluates both)."""
    groups = " ".join(f"--arm {arm} " + " ".join(str(out / f"{arm}-s{s}") for s in seeds) for arm in arms)
    pooled = " --pool 'levels 1-3=test+family'" if pool else ""
    return f".venv/bin/spanlab compare --start {out / 'start'} --start-phase warm_start {groups}{pooled}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="stores, run folders, configs, logs (default: "
                        "runs/recipes, with --quick runs/recipes-quick)")
    parser.add_argument("--arms", default="reference", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--seeds", default="0", help="comma-separated rollouts.seed values (default 0)")
    parser.add_argument("--quick", action="store_true", help="calc's quick.yaml instead of the main job")
    parser.add_argument("--resume", action="store_true", help="continue a stopped stage from its last GRPO step")
    parser.add_argument("--sealed", default=None, help="evaluate the sealed split on these finished runs "
                        "(comma-separated stage names, e.g. start,lora-s0) instead of training anything")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if unknown := sorted(set(arms) - set(ARMS)):
        parser.error(f"--arms: unknown {unknown}; arms are {list(ARMS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds: give integers, got {args.seeds!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = (args.out or Path("runs/recipes-quick" if args.quick else "runs/recipes")).resolve()
    base = load_yaml(QUICK_BASE if args.quick else BASE)
    try:
        if args.sealed:
            tasks = 6 if args.quick else SEALED_TASKS
            for run in args.sealed.split(","):
                if not (out / run / "final").is_dir():
                    raise ConfigError(f"--sealed {run}: no {out / run / 'final'} (did that stage finish?)")
                run_stage(f"sealed-{run}", sealed_config(run, base, out, tasks), out, resume=args.resume)
            return
        train_tasks = start_train_tasks(stage_config("start", base, out, 0))
        run_stage("start", stage_config("start", base, out, train_tasks), out, resume=args.resume)
        for seed in seeds:
            for arm in arms:
                name = f"{arm}-s{seed}"
                run_stage(name, stage_config(name, base, out, train_tasks), out, resume=args.resume)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    sys.stdout.write(f"the table:\n  {compare_command(out, arms, seeds, pool=not args.quick)}\n")


if __name__ == "__main__":
    main()
