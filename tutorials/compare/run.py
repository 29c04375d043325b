"""One table across algorithms on the calc main job: the same start, the same rollout budget, every held-out split.

Run from the repo root (each GRPO-sized arm at the default budget takes about the main job's GRPO phase, ~25 min
on 2 idle cores; 3-4x longer when other work shares them):

    PYTHONPATH=. .venv/bin/python tutorials/compare/run.py [--out DIR] [--budget 1152] [--eval-tasks 90] [--resume]
    PYTHONPATH=. .venv/bin/python tutorials/compare/run.py --start-from runs/calc-ws   # an existing warm start
    PYTHONPATH=. .venv/bin/python tutorials/compare/run.py --quick   # every stage at its smallest: a try, not a result

Stages, each a normal ``spanlab train`` config written to ``OUT/configs/NAME.yaml`` (the base
``tutorials/calc/grpo.yaml`` deep-merged with ``tutorials/compare/arms/NAME.yaml``) and run as
``python -m spanlab train`` in a subprocess, each with its own store ``OUT/NAME.duckdb`` (``tutorials/stages.py``):

1. ``start``: the base config's SFT warm start, no training steps; writes the servable ``OUT/start/final/``.
   ``--start-from RUN`` uses a finished run of that config with ``grpo.steps: 0`` instead (its ``final/`` and
   its store's ``warm_start`` evaluation).
2. ``grpo``, ``sft``, ``apo``: each from the start's folder with no warm start and no base evaluation of its own
   (``eval.base: false``: the start's evaluation is the baseline); the budget sets ``grpo.steps``,
   ``sft.rounds`` (SFT rounds are shaped like GRPO steps: the same tasks per step and samples per task) or
   ``apo.max_rollouts`` so each arm runs ``--budget`` training rollouts, and ``dataset.train_tasks`` gives each
   the start's train tasks.
3. ``apo-grpo``: the grpo arm, starting from the apo arm's winning prompt (``prompt: OUT/apo/winner.poml``); its
   own budget comes on top of the apo arm's.

Every split of the base config is evaluated (test, family, test_l4, family_l4, depth for the main job). A
finished stage is reused; ``--resume`` continues a stopped one (GRPO from its last step; SFT and APO, which
cannot resume, start over, their leftovers moved to ``OUT/stopped/``). At the end: ``OUT/table.md``
(:mod:`spanlab.compare`, seeded bootstrap intervals) and, from one SQL query over the five stores
(``gains.sql``, :mod:`gains`), ``OUT/gains.md`` with the extra-operation share and the bar chart
``OUT/gains.png``. ``--table-only`` rebuilds them from the stores.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(HERE)]

import gains  # noqa: E402

from spanlab.compare import Arm, build_table, load_winner  # noqa: E402
from spanlab.config import load_yaml  # noqa: E402
from spanlab.errors import ConfigError  # noqa: E402
from tutorials.stages import deep_merge, from_checkpoint, run_stage, split_names, start_train_tasks  # noqa: E402

logger = logging.getLogger("compare")

BASE = ROOT / "tutorials" / "calc" / "grpo.yaml"
QUICK_BASE = ROOT / "tutorials" / "calc" / "quick.yaml"
QUICK = {"out": Path("runs/compare-quick"), "budget": 32, "eval_tasks": 6}  # 32: two GRPO steps of quick.yaml
DEFAULTS = {"out": Path("runs/compare"), "budget": 1152, "eval_tasks": 90}  # the main job's 9 steps x 16 x 8
STAGES = ("start", "grpo", "sft", "apo", "apo-grpo")
ALGORITHMS = ("grpo", "sft", "apo")


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
                 start_eval_tasks: int | None = None, start_model: Path | None = None) -> dict[str, Any]:
    """The full train config of stage ``name`` (the start may be evaluated on more tasks than the arms; its
    folder is ``OUT/start/final`` unless ``start_model`` names another)."""
    arm = load_yaml(HERE / "arms" / f"{name}.yaml")
    arm.pop("after", None)
    config = deep_merge(base, arm)
    if config["algorithm"] == "sft":  # an SFT round samples what a GRPO step samples
        grpo = base.get("grpo", {})
        config["sft"] = {**config.get("sft", {}), "tasks_per_round": grpo["tasks_per_step"],
                         "samples_per_task": grpo["group_size"]}
    for other in set(ALGORITHMS) - {config["algorithm"]}:
        config.pop(other, None)
    config.update(run_name=name, out_dir=str(out), db=str(out / f"{name}.duckdb"))
    tasks = start_eval_tasks or eval_tasks if name == "start" else eval_tasks
    config["eval"] = {**config.get("eval", {}), "tasks": tasks}
    config["eval"].pop("curve", None)  # the table reads the start and the end only
    if name == "start":
        return config
    # The same train tasks as the start (its warm start asks for them): without it an arm would generate only
    # twice its own draws, and RL's pool (the train_levels ones among them) would shrink to a handful.
    config = from_checkpoint(config, start_model or out / "start" / "final",
                             start_train_tasks(stage_config("start", base, out, budget, eval_tasks, start_eval_tasks)))
    config["eval"]["base"] = config["algorithm"] == "apo"  # APO evaluates its own start (its paired difference
    # needs it); the others are paired with the start's evaluation
    set_budget(config, budget)
    if name == "apo-grpo":
        config["prompt"] = str(out / "apo" / "winner.poml")
    return config


def start_config(base: dict[str, Any], out: Path, budget: int, eval_tasks: int, start_eval_tasks: int | None,
                 start_from: Path | None) -> dict[str, Any]:
    """The start stage: the warm start, or, ``start_from``, an evaluation of that run's folder (phase ``base``)
    on today's tasks, so that the arms are paired with a start evaluated on the very tasks they are."""
    config = stage_config("start", base, out, budget, eval_tasks, start_eval_tasks)
    if start_from is None:
        return config
    config = from_checkpoint(config, start_from / "final", start_train_tasks(config))
    config["eval"]["base"] = True
    return config


def arms(out: Path, walls: dict[str, float], *, start_from: Path | None = None) -> list[Arm]:
    """The table's rows: the base model and the start (both from the start's store), then each arm."""
    start = out / "start.duckdb"
    if start_from is None:
        rows = [Arm("base model (no warm start)", "-", start, "base", counts_rollouts=False),
                Arm("start: SFT warm start", "warm start", start, "warm_start", walls.get("start"))]
    else:
        rows = [Arm(f"start: {start_from / 'final'}", "warm start", start, "base", walls.get("start"))]
    labels = {"grpo": ("GRPO", "grpo"), "sft": ("SFT rounds", "sft"), "apo": ("APO (prompt only, demos)", "apo"),
              "apo-grpo": ("APO then GRPO", "apo, then grpo")}
    for name, (label, algorithm) in labels.items():
        chained = name == "apo-grpo"
        rows.append(Arm(label, algorithm, out / f"{name}.duckdb", "final", walls.get(name),
                        after=out / "apo.duckdb" if chained else None,
                        after_wall_s=walls.get("apo") if chained else None,
                        fallback="base" if name == "apo" else None))
    return rows


def tables(out: Path, walls: dict[str, float], splits: tuple[str, ...], budget: int,
           start_from: Path | None) -> None:
    """``OUT/table.md`` (bootstrap intervals) and, when every stage ran, the SQL query's ``gains.md`` and chart."""
    rows = []
    for arm in arms(out, walls, start_from=start_from):  # an unfinished comparison: the stages that ran
        if arm.db.is_file():
            rows.append(arm)
        else:
            logger.warning("%s: %s does not exist (the stage has not run); left out of the table", arm.label, arm.db)
    baseline = next((r for r in rows if r.label.startswith("start")), None)
    if baseline is None:
        raise ConfigError(f"{out / 'start.duckdb'}: no such store (the start stage has not run)")
    table = build_table(rows, baseline=baseline, splits=splits)
    (out / "table.md").write_text(table + "\n")
    sys.stdout.write(table + "\n")
    logger.info("table written to %s", out / "table.md")
    if all((out / f"{name}.duckdb").is_file() for name in STAGES):
        sys.stdout.write("\n" + gains.write(out, f"paired gain over the start, {budget} training rollouts per arm "
                                                  "(APO then GRPO: twice)") + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="stores, runs, configs, tables (default: "
                        "runs/compare, with --quick runs/compare-quick)")
    parser.add_argument("--budget", type=int, default=None, help="training rollouts per arm (default: 1152, the "
                        "main job's 9 GRPO steps; with --quick 32)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks per split (default: 90, with "
                        "--quick 6)")
    parser.add_argument("--quick", action="store_true", help="the base tutorials/calc/quick.yaml (a 32-demo warm "
                        "start) instead of grpo.yaml, with the sizes above: the whole comparison in a few minutes "
                        "per stage; its table is noise")
    parser.add_argument("--start-eval-tasks", type=int, default=None, help="held-out tasks per split for the "
                        "start (default: --eval-tasks); the arms are paired with it on their own tasks, a prefix")
    parser.add_argument("--start-from", type=Path, default=None, help="a finished warm-start run folder of the "
                        "base config (grpo.steps: 0; its final/ is served): the start stage only evaluates it")
    parser.add_argument("--resume", action="store_true", help="continue a stopped stage (GRPO from its last step; "
                        "SFT and APO start over)")
    parser.add_argument("--table-only", action="store_true", help="rebuild the tables from the stores in --out")
    parser.add_argument("--stages", default=",".join(STAGES), help="run only these stages (comma-separated), "
                        "e.g. start; a later run of all stages reuses them")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = args.out.resolve()
    start_from = args.start_from.resolve() if args.start_from is not None else None
    if start_from is not None and not (start_from / "final").is_dir():
        parser.error(f"--start-from {args.start_from}: no final/ folder in it (not a finished run folder)")
    base = load_yaml(QUICK_BASE if args.quick else BASE)
    walls: dict[str, float] = {}
    chosen = args.stages.split(",")
    if unknown := sorted(set(chosen) - set(STAGES)):
        parser.error(f"--stages: unknown {unknown}; stages are {list(STAGES)}")
    try:
        for name in [s for s in STAGES if s in chosen]:
            if args.table_only:
                timing = out / name / "wall.json"
                walls[name] = float(json.loads(timing.read_text())["seconds"]) if timing.is_file() else math.nan
                continue
            config = start_config(base, out, args.budget, args.eval_tasks, args.start_eval_tasks, start_from) \
                if name == "start" else stage_config(name, base, out, args.budget, args.eval_tasks,
                                                     args.start_eval_tasks, start_from and start_from / "final")
            if name == "apo-grpo":
                winner = out / "apo" / "winner.poml"
                winner.write_text(load_winner(out / "apo.duckdb", out / "apo" / "apo.json"))
            walls[name] = run_stage(name, config, out, resume=args.resume)
        if chosen != list(STAGES) and not args.table_only:
            return
        tables(out, walls, split_names(base), args.budget, start_from)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
