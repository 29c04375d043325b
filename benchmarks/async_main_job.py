"""Sync vs async GRPO (K=1, K=2) on the main job's config, real engine: wall time, steps/min, engine idle, accuracy.

Each arm is ``spanlab train`` on ``tutorials/calc/grpo.yaml`` (same seeds, same everything) with only ``loop:``,
``run_name``, ``db`` and ``out_dir`` changed, plus the shortening given on the command line (``--steps``,
``--eval-tasks``, ``--no-extra-splits``, no final checkpoint) applied to all arms alike. Each arm starts its own
vLLM (the default), one after another.

**Engine idle fraction** (docs/async.md): over the GRPO loop (from the first train rollout's enqueue to the
first final-evaluation rollout's), the share of time with no model call in flight through the recording
gateway, i.e. 1 - (union of the loop's ``llm_call`` span intervals) / loop time. A gateway-side measure: the
engine may be computing for a call inside an interval, never outside one. Why not vLLM's ``/metrics``: it
exports gauges of running requests (sampled, not integrated over time) and per-request histograms, no busy
time; the spans are already stored with their start and end.

Run from the repo root: PYTHONPATH=. .venv/bin/python benchmarks/async_main_job.py --steps 3 --eval-tasks 20
(``--device gpu`` on a GPU machine: scripts/gpu_check.sh stage 4 runs it so).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import yaml

REPO = Path(__file__).resolve().parents[1]
ARMS = {"sync": {"mode": "sync"}, "async K=1": {"mode": "async", "max_staleness": 1},
        "async K=2": {"mode": "async", "max_staleness": 2}}

IDLE_SQL = """
WITH w AS (
  SELECT (SELECT min(enqueue_time) FROM rollouts WHERE mode = 'train') AS t0,
         (SELECT min(enqueue_time) FROM rollouts WHERE mode = 'test' AND metadata->>'phase' = 'final') AS t1),
calls AS (
  SELECT greatest(s.start_time, w.t0) AS a, least(s.end_time, w.t1) AS b
  FROM spans s, w WHERE s.kind = 'llm_call' AND s.end_time > w.t0 AND s.start_time < w.t1),
ordered AS (SELECT a, b, max(b) OVER (ORDER BY a ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_b
            FROM calls),
islands AS (SELECT a, b, sum(CASE WHEN prev_b IS NULL OR a > prev_b THEN 1 ELSE 0 END) OVER (ORDER BY a) AS k
            FROM ordered)
SELECT (SELECT t1 - t0 FROM w) AS loop_s,
       (SELECT sum(e - s) FROM (SELECT min(a) AS s, max(b) AS e FROM islands GROUP BY k)) AS busy_s
"""


def engine_idle(db: Path) -> tuple[float, float]:
    """(loop seconds, idle fraction) from the run's spans (see the module docstring)."""
    with duckdb.connect(str(db), read_only=True) as con:
        ((loop_s, busy_s),) = con.sql(IDLE_SQL).fetchall()
    return float(loop_s), 1.0 - float(busy_s or 0.0) / float(loop_s)


def arm_config(base: dict[str, Any], name: str, loop: dict[str, Any], out: Path, args: argparse.Namespace) -> Path:
    cfg = json.loads(json.dumps(base))
    slug = name.replace(" ", "").replace("=", "").lower()
    cfg.update(run_name=f"bench-{slug}", db=str(out / f"{slug}.duckdb"), out_dir=str(out / "runs"), loop=loop)
    cfg["grpo"]["steps"] = args.steps
    cfg["eval"]["tasks"] = args.eval_tasks
    if args.no_warm_start:
        cfg.pop("warm_start", None)
    elif args.warm_demos is not None:
        cfg["warm_start"]["demos"] = args.warm_demos
    if args.tasks_per_step is not None:
        cfg["grpo"]["tasks_per_step"] = args.tasks_per_step
    if args.no_extra_splits:
        cfg["eval"]["extra_splits"] = []
    cfg["checkpoints"] = {"final": False, "resume_state": False}
    if args.device == "gpu":  # the engine only: the config's trainer (1 process, in the job) stays where it is
        cfg["engine"] = {**cfg["engine"], "device": "gpu"}
        cfg["engine"].pop("kv_cache_gib", None)
    if args.model:
        cfg["engine"]["model"] = args.model
    path = out / f"{slug}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "tutorials/calc/grpo.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--eval-tasks", type=int, default=90)
    ap.add_argument("--no-extra-splits", action="store_true")
    ap.add_argument("--warm-demos", type=int, default=None, help="warm_start.demos (default: the config's)")
    ap.add_argument("--no-warm-start", action="store_true", help="drop warm_start (its SFT is the same in every arm)")
    ap.add_argument("--tasks-per-step", type=int, default=None, help="grpo.tasks_per_step (default: the config's)")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="engine.device of every arm")
    ap.add_argument("--model", default=None, help="engine.model of every arm (default: the config's)")
    ap.add_argument("--out", type=Path, default=REPO / "runs/bench-async")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of: " + ", ".join(ARMS))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(args.config.read_text())
    rows = []
    for name in args.arms.split(","):
        path = arm_config(base, name, ARMS[name], args.out, args)
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "spanlab.cli", "train", str(path)], check=True, cwd=REPO)
        wall = time.monotonic() - t0
        cfg = yaml.safe_load(path.read_text())
        report = json.loads((Path(cfg["out_dir"]) / cfg["run_name"] / "report.json").read_text())
        steps = report["steps"]
        loop_s, idle = engine_idle(Path(cfg["db"]))
        acc = {e["phase"]: e["accuracy"] for e in report["evaluations"] if e.get("split", "test") == "test"}
        rows.append((name, wall, len(steps) / (steps[-1]["loop_s"] / 60), loop_s, idle,
                     acc.get("warm_start", float("nan")), acc.get("final", float("nan")),
                     max((s.get("staleness_max", 0.0) for s in steps), default=0.0)))
        print(f"{name}: done in {wall:.0f}s", flush=True)
    print("| arm | wall (s) | GRPO steps/min | loop (s) | engine idle | held-out acc warm start -> final | "
          "max staleness |")
    print("|---|---|---|---|---|---|---|")
    for name, wall, spm, loop_s, idle, a0, a1, st in rows:
        print(f"| {name} | {wall:.0f} | {spm:.2f} | {loop_s:.0f} | {idle:.0%} | {a0:.1%} -> {a1:.1%} | {st:.0f} |")


if __name__ == "__main__":
    main()
