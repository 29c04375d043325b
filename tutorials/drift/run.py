"""The drift experiment on the main job: exact token IDs vs re-tokenized text, several runs each, one start.

Run from the repo root (each run's time: about the main job's GRPO phase, ~25 min on 2 idle cores):

    PYTHONPATH=. .venv/bin/python tutorials/drift/run.py [--out runs/drift] [--runs 2] [--resume]
    PYTHONPATH=. .venv/bin/python tutorials/drift/run.py --quick   # every stage at its smallest: a try, not a result

Stages, each a normal ``spanlab train`` config written to ``OUT/configs/NAME.yaml`` (the main job,
``tutorials/calc/grpo.yaml``, deep-merged with ``tutorials/drift/arms/ARM.yaml``) and run in a subprocess with
its own store ``OUT/NAME.duckdb`` (``tutorials/stages.py``):

1. ``start``: the main job's SFT warm start, no GRPO step; writes the servable ``OUT/start/final/``.
2. ``exact-1`` .. ``exact-N`` and ``retokenized-1`` .. ``retokenized-N``: the main job's GRPO from
   ``engine.model: OUT/start/final``, with no warm start and no base evaluation of its own (the start's
   evaluation is every run's start), the start's train tasks, and the main job's learning curve on test_l4.
   The arms differ only in ``token_source`` / ``retokenize_template``.

vLLM's sampling is not seeded, so the N runs of an arm are independent runs of one config (the same config and
``dataset.seed``), not N seeds. A finished stage is reused; ``--resume`` continues a stopped one from its last
GRPO step (``spanlab train --resume``). At the end it prints the ``compare.py`` command for the figure and table.
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

logger = logging.getLogger("drift")

HERE = Path(__file__).resolve().parent
BASE = ROOT / "tutorials" / "calc" / "grpo.yaml"
QUICK_BASE = ROOT / "tutorials" / "calc" / "quick.yaml"
ARMS = ("exact", "retokenized")
# --quick: calc's quick.yaml (a 32-demo warm start, 2 GRPO steps of 4 x 4, 6 held-out tasks) with a held-out
# point after step 1, so that the curve panel has one between the start and the end.
QUICK = {"eval": {"curve": {"splits": ["test"], "every": 1}}}


def stage_config(name: str, base: dict[str, Any], out: Path, train_tasks: int,
                 start_from: Path | None = None) -> dict[str, Any]:
    """The full train config of stage ``name`` (``start`` or ``ARM-i``). With ``start_from`` (a finished
    warm-start run folder of the main job) the start only evaluates that run's ``final/`` (phase ``base``), on
    today's tasks, and every run starts from that folder."""
    arm = name if name == "start" else name.rsplit("-", 1)[0]
    config = deep_merge(base, load_yaml(HERE / "arms" / f"{arm}.yaml"))
    config.update(run_name=name, out_dir=str(out), db=str(out / f"{name}.duckdb"))  # run folder: OUT/NAME
    model = start_from / "final" if start_from is not None else out / "start" / "final"
    if name == "start" and start_from is None:
        return config
    config = from_checkpoint(config, model, train_tasks)
    config["eval"] = {**config.get("eval", {}), "base": name == "start"}
    return config


def stage_names(runs: int) -> list[str]:
    return ["start", *(f"{arm}-{i}" for arm in ARMS for i in range(1, runs + 1))]


def compare_command(out: Path, runs: int, curve_split: str, start_phase: str = "warm_start") -> str:
    arms = " ".join(f"--arm {arm} " + " ".join(str(out / f"{arm}-{i}") for i in range(1, runs + 1)) for arm in ARMS)
    return (f"PYTHONPATH=. .venv/bin/python tutorials/drift/compare.py --start {out / 'start'} --start-phase "
            f"{start_phase} {arms} --curve-split {curve_split} --out {out / 'drift.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="stores, run folders, configs, logs (default: "
                        "runs/drift, with --quick runs/drift-quick)")
    parser.add_argument("--runs", type=int, default=2, help="independent runs per arm (default 2)")
    parser.add_argument("--quick", action="store_true", help="calc's quick.yaml instead of the main job: every "
                        "stage in a few minutes; its curves are noise")
    parser.add_argument("--resume", action="store_true", help="continue a stopped stage from its last GRPO step")
    parser.add_argument("--start-from", type=Path, default=None, help="a finished warm-start run folder of the "
                        "main job (grpo.steps: 0): the start stage only evaluates its final/, which every run trains")
    parser.add_argument("--stages", default=None, help="run only these stages (comma-separated, e.g. start,exact-1)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: give at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = (args.out or Path("runs/drift-quick" if args.quick else "runs/drift")).resolve()
    base = deep_merge(load_yaml(QUICK_BASE), QUICK) if args.quick else load_yaml(BASE)
    names = stage_names(args.runs)
    chosen = args.stages.split(",") if args.stages else names
    if unknown := sorted(set(chosen) - set(names)):
        parser.error(f"--stages: unknown {unknown}; stages are {names}")
    start_from = args.start_from.resolve() if args.start_from is not None else None
    if start_from is not None and not (start_from / "final").is_dir():
        parser.error(f"--start-from {args.start_from}: no final/ folder in it (not a finished run folder)")
    try:
        train_tasks = start_train_tasks(stage_config("start", base, out, 0))  # what the warm start generates
        for name in [n for n in names if n in chosen]:
            run_stage(name, stage_config(name, base, out, train_tasks, start_from), out, resume=args.resume)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    command = compare_command(out, args.runs, "test" if args.quick else "test_l4",
                              "warm_start" if start_from is None else "base")
    sys.stdout.write(f"the figure and the table:\n  {command}\n")


if __name__ == "__main__":
    main()
