"""Two runs of one config, compared rollout by rollout: did they sample the same tokens and score the same?

A run with ``rollouts.seed`` should repeat itself exactly (docs/runs.md, "Reproducible runs"); one without
should not. Rollouts are matched by what they are (mode, step, phase, split, task, sample; never their random
IDs), calls by their order in the attempt. Prints one JSON object: rollouts and calls compared, rollouts whose
calls all sampled the same token IDs (per mode), equal final rewards, train metrics equal (timings aside) and
the largest relative gap among the others, and each step's train reward in both runs.

Run: .venv/bin/python benchmarks/seeded_runs.py runs/a.duckdb runs/b.duckdb
(each store from ``spanlab train X.yaml`` with its own ``run_name`` and ``db``; docs/results.md, "Seeded runs").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from spanlab.store import SpanStore

IDENTITY = ("step", "phase", "split", "group_id", "sample")
_KEY = "concat_ws('|', r.mode, " + ", ".join(f"json_extract_string(r.metadata, '$.{k}')" for k in IDENTITY) + ")"
_TIMINGS = ("_s", "seconds")  # metric names ending so are wall-clock times or rates, which differ in any rerun


def _timing(name: str) -> bool:
    return name.endswith(_TIMINGS) or "rss" in name


def read_run(db: str | Path) -> dict[str, Any]:
    """A run's sampled token IDs per rollout (its calls in order), final rewards and train metrics."""
    with SpanStore(db) as store:
        calls = store.query(f"SELECT {_KEY} AS key, r.mode, c.response_token_ids AS ids FROM llm_calls c "
                            "JOIN rollouts r USING (rollout_id) ORDER BY key, c.sequence_id").to_pylist()
        rewards = store.query(f"SELECT {_KEY} AS key, w.value FROM rewards w JOIN rollouts r USING (rollout_id) "
                              "WHERE w.final").to_pylist()
        metrics = store.query("SELECT step, name, value FROM train_metrics").to_pylist()
    tokens: dict[tuple[str, str], list[list[int]]] = {}
    for row in calls:
        tokens.setdefault((row["mode"], row["key"]), []).append(list(row["ids"] or []))
    return {"tokens": tokens, "rewards": {r["key"]: r["value"] for r in rewards},
            "metrics": {(m["step"], m["name"]): m["value"] for m in metrics}}


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """How far two runs read with :func:`read_run` are the same run."""
    keys = set(a["tokens"]) | set(b["tokens"])
    same_tokens: dict[str, list[int]] = {}
    for mode, key in sorted(keys):
        counts = same_tokens.setdefault(mode, [0, 0])
        counts[0] += a["tokens"].get((mode, key)) == b["tokens"].get((mode, key))
        counts[1] += 1
    reward_keys = set(a["rewards"]) | set(b["rewards"])
    metric_keys = {k for k in set(a["metrics"]) | set(b["metrics"]) if not _timing(k[1])}
    pairs = [(a["metrics"].get(k), b["metrics"].get(k)) for k in metric_keys]
    differ = [(x, y) for x, y in pairs if x != y]
    gap = max((abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in differ if x is not None and y is not None),
              default=0.0)
    steps = sorted({s for s, name in a["metrics"] if name == "reward_mean"})
    return {"rollouts": len(keys), "calls": sum(len(v) for v in a["tokens"].values()),
            "same_tokens_by_mode": {m: {"same": c[0], "of": c[1]} for m, c in same_tokens.items()},
            "same_final_reward": sum(a["rewards"].get(k) == b["rewards"].get(k) for k in reward_keys),
            "rewards": len(reward_keys), "train_metrics": len(metric_keys),
            "train_metrics_equal": len(metric_keys) - len(differ),
            "largest_relative_gap": gap,
            "reward_mean_per_step": [[a["metrics"].get((s, "reward_mean")), b["metrics"].get((s, "reward_mean"))]
                                     for s in steps]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="the first run's DuckDB store")
    parser.add_argument("second", help="the second run's DuckDB store")
    args = parser.parse_args()
    print(json.dumps(compare(read_run(args.first), read_run(args.second))))


if __name__ == "__main__":
    main()
