"""One table across algorithms on the calc agent: the same start, the same rollout budget, held-out accuracy.

Run from the repo root (docs/results.md has the measured run, --budget 32 --eval-tasks 20
--start-eval-tasks 60, and its times; the defaults below are larger and not timed):

    PYTHONPATH=. .venv/bin/python tutorials/compare/run.py [--out DIR] [--budget 128] [--eval-tasks 60]
    PYTHONPATH=. .venv/bin/python tutorials/compare/run.py --quick   # every stage at its smallest: a try, not a result

Stages, each a normal ``spanlab train`` config written to ``OUT/configs/NAME.yaml`` (the base
``tutorials/calc/grpo.yaml`` deep-merged with ``tutorials/compare/arms/NAME.yaml``) and run as
``python -m spanlab train`` in a subprocess, each with its own store ``OUT/NAME.duckdb``:

1. ``start``: the base config's SFT warm start, no training steps; writes the servable ``OUT/start/final/``.
2. ``grpo``, ``sft``, ``apo``: each from ``engine.model: OUT/start/final`` with no warm start and no base
   evaluation of its own (``eval.base: false``: the start's evaluation is the baseline); the budget sets
   ``grpo.steps``, ``sft.rounds`` or ``apo.max_rollouts`` so each arm runs ``--budget`` training rollouts,
   and ``dataset.train_tasks`` gives each the start's train tasks.
3. ``apo-grpo``: the grpo arm, starting from the apo arm's winning prompt (``prompt: OUT/apo/winner.poml``).

A stage whose ``OUT/NAME/report.json`` exists is reused (so an interrupted comparison continues); its wall
time is the one recorded when it ran. The table (:mod:`spanlab.compare`) is printed and written to
``OUT/table.md``; ``--table-only`` rebuilds it from the stores. Only the splits ``test`` and ``family`` are
evaluated (the base config's ``depth`` split is dropped to save time).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spanlab.compare import Arm, build_table, load_winner  # noqa: E402
from spanlab.config import load_yaml  # noqa: E402

logger = logging.getLogger("compare")

HERE = Path(__file__).resolve().parent
BASE = ROOT / "tutorials" / "calc" / "grpo.yaml"
QUICK_BASE = ROOT / "tutorials" / "calc" / "quick.yaml"
QUICK = {"out": Path("runs/compare-quick"), "budget": 32, "eval_tasks": 6}  # 32: one SFT round of the sft arm
DEFAULTS = {"out": Path("runs/compare"), "budget": 128, "eval_tasks": 60}
STAGES = ("start", "grpo", "sft", "apo", "apo-grpo")
ALGORITHMS = ("grpo", "sft", "apo")
SPLITS = ("test", "family")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, mappings merged key by key (a copy; neither input changes)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def set_budget(config: dict[str, Any], budget: int) -> None:
    """The algorithm's size key, so that the arm runs exactly ``budget`` training rollouts."""
    name = config["algorithm"]
    section = config.setdefault(name, {})
    if name == "apo":  # the start prompt and each variant on val, the start prompt on the pool: budget in all
        demos = section.setdefault("demos", {})
        section["val_tasks"] = max(budget // 8, 8)
        demos["pool_tasks"] = budget // 2
        demos["candidates"] = max((budget - demos["pool_tasks"]) // section["val_tasks"] - 1, 1)
        section["max_rollouts"] = budget
        return
    keys = {"grpo": ("steps", "tasks_per_step", "group_size"),
            "sft": ("rounds", "tasks_per_round", "samples_per_task")}[name]
    per_step = section[keys[1]] * section[keys[2]]
    if budget % per_step:
        raise SystemExit(f"--budget {budget}: {name} runs {per_step} rollouts per step ({keys[1]} x {keys[2]}); "
                         "give a multiple of it")
    section[keys[0]] = budget // per_step


def stage_config(name: str, base: dict[str, Any], out: Path, budget: int, eval_tasks: int,
                 start_eval_tasks: int | None = None) -> dict[str, Any]:
    """The full train config of stage ``name`` (the start may be evaluated on more tasks than the arms)."""
    arm = load_yaml(HERE / "arms" / f"{name}.yaml")
    arm.pop("after", None)
    config = deep_merge(base, arm)
    for other in set(ALGORITHMS) - {config["algorithm"]}:
        config.pop(other, None)
    config.update(run_name=name, out_dir=str(out), db=str(out / f"{name}.duckdb"))
    tasks = start_eval_tasks or eval_tasks if name == "start" else eval_tasks
    config["eval"] = {**config.get("eval", {}), "tasks": tasks, "extra_splits": list(SPLITS[1:])}
    if name == "start":
        return config
    # The same train tasks as the start (its warm start asks for them): without it an arm would generate only
    # twice its own draws, and RL's pool (the train_levels ones among them) would shrink to a handful.
    config["dataset"] = {**config.get("dataset", {}), "train_tasks": 2 * int(config["warm_start"]["demos"])}
    config.pop("warm_start", None)
    config["engine"] = {**config.get("engine", {}), "model": str(out / "start" / "final")}
    config["eval"]["base"] = config["algorithm"] == "apo"  # APO evaluates its own start (its paired difference
    # needs it); the others are paired with the start's evaluation
    set_budget(config, budget)
    if name == "apo-grpo":
        config["prompt"] = str(out / "apo" / "winner.poml")
    return config


def run_stage(name: str, config: dict[str, Any], out: Path) -> float:
    """Run one stage with ``spanlab train`` (skipped when its report exists); returns its wall seconds."""
    run_dir, timing = out / name, out / name / "wall.json"
    if (run_dir / "report.json").is_file() and timing.is_file():
        seconds = float(json.loads(timing.read_text())["seconds"])
        logger.info("%s: reusing the finished run in %s (%.0f s when it ran)", name, run_dir, seconds)
        return seconds
    path = out / "configs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    logger.info("%s: spanlab train %s (log: %s)", name, path, log)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    with log.open("w") as fh:
        done = subprocess.run([sys.executable, "-m", "spanlab", "train", str(path)], cwd=ROOT, env=env,
                              stdout=fh, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: spanlab train exited with {done.returncode}; see {log}")
    timing.write_text(json.dumps({"seconds": seconds}) + "\n")
    logger.info("%s: done in %.0f s", name, seconds)
    return seconds


def arms(out: Path, walls: dict[str, float]) -> list[Arm]:
    """The table's rows: the base model and the start (both from the start's store), then each arm."""
    start = out / "start.duckdb"
    rows = [Arm("base model (no warm start)", "-", start, "base", counts_rollouts=False),
            Arm("start: SFT warm start", "warm start", start, "warm_start", walls.get("start"))]
    labels = {"grpo": ("GRPO", "grpo"), "sft": ("SFT rounds", "sft"), "apo": ("APO (prompt only, demos)", "apo"),
              "apo-grpo": ("APO then GRPO", "apo, then grpo")}
    for name, (label, algorithm) in labels.items():
        chained = name == "apo-grpo"
        rows.append(Arm(label, algorithm, out / f"{name}.duckdb", "final", walls.get(name),
                        after=out / "apo.duckdb" if chained else None,
                        after_wall_s=walls.get("apo") if chained else None,
                        fallback="base" if name == "apo" else None))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="stores, runs, configs, table.md (default: "
                        "runs/compare, with --quick runs/compare-quick)")
    parser.add_argument("--budget", type=int, default=None, help="training rollouts per arm (default: 128, with "
                        "--quick 32)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks per split (default: 60, with "
                        "--quick 6)")
    parser.add_argument("--quick", action="store_true", help="the base tutorials/calc/quick.yaml (a 32-demo warm "
                        "start) instead of grpo.yaml, with the sizes above: the whole comparison in a few minutes "
                        "per stage; its table is noise")
    parser.add_argument("--start-eval-tasks", type=int, default=None, help="held-out tasks per split for the "
                        "start (default: --eval-tasks); the arms are paired with it on their own tasks, a prefix")
    parser.add_argument("--table-only", action="store_true", help="rebuild the table from the stores in --out")
    parser.add_argument("--stages", default=",".join(STAGES), help="run only these stages (comma-separated), "
                        "e.g. start; a later run of all stages reuses them")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = args.out.resolve()
    base = load_yaml(QUICK_BASE if args.quick else BASE)
    walls: dict[str, float] = {}
    chosen = args.stages.split(",")
    if unknown := sorted(set(chosen) - set(STAGES)):
        parser.error(f"--stages: unknown {unknown}; stages are {list(STAGES)}")
    for name in [s for s in STAGES if s in chosen]:
        config = stage_config(name, base, out, args.budget, args.eval_tasks, args.start_eval_tasks)
        if args.table_only:
            timing = out / name / "wall.json"
            walls[name] = float(json.loads(timing.read_text())["seconds"]) if timing.is_file() else float("nan")
            continue
        if name == "apo-grpo":
            winner = out / "apo" / "winner.poml"
            winner.write_text(load_winner(out / "apo.duckdb", out / "apo" / "apo.json"))
        walls[name] = run_stage(name, config, out)
    if chosen != list(STAGES) and not args.table_only:
        return
    rows = []
    for arm in arms(out, walls):  # --table-only on an unfinished comparison: the stages that ran
        if arm.db.is_file():
            rows.append(arm)
        else:
            logger.warning("%s: %s does not exist (the stage has not run); left out of the table", arm.label, arm.db)
    table = build_table(rows, baseline=rows[1], splits=SPLITS)
    (out / "table.md").write_text(table + "\n")
    sys.stdout.write(table + "\n")
    logger.info("table written to %s", out / "table.md")


if __name__ == "__main__":
    main()
