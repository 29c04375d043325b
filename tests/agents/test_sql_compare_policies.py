"""tutorials/sql/compare_policies.py on two hand-made stores: what it reads (held-out accuracy, the sql.verdict
rewards) and the paired differences it prints, worked out by hand."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from spanlab.store import SpanStore
from spanlab.types import Rollout, reward_span
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "tutorials" / "sql" / "compare_policies.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "compare_policies")


def _store(path: Path, phases: dict[str, list[tuple[float, float]]]) -> Path:
    """Held-out rollouts per phase: (verdict reward, final reward) for tasks t0, t1, ..."""
    with SpanStore(path) as store:
        for phase, outcomes in phases.items():
            for i, (verdict, final) in enumerate(outcomes):
                store.enqueue([Rollout(input={"task_id": f"t{i}"}, mode="test",
                                       metadata={"phase": phase, "split": "test"})])
                got = store.dequeue(worker_id="w")
                assert got is not None
                rid, aid = got[0].rollout_id, got[1].attempt_id
                store.add_spans([reward_span(rid, aid, verdict, name="sql.verdict"), reward_span(rid, aid, final)])
                store.finish_attempt(aid, "succeeded")
    return path


def test_the_table_pairs_each_arm_with_the_start_and_the_arms_with_each_other(tmp_path: Path) -> None:
    script = _script()
    start = _store(tmp_path / "warm.duckdb", {"warm_start": [(0, 0), (1, 1), (0, 0), (1, 0)]})
    shared = _store(tmp_path / "shared.duckdb", {"final": [(0, 1), (1, 1), (0, 0), (1, 0)]})
    per_role = _store(tmp_path / "per_role.duckdb", {"final": [(1, 1), (1, 1), (1, 1), (0, 0)]})
    with SpanStore(start) as store:
        assert script.verdicts(store, "warm_start") == {"t0": 0.0, "t1": 1.0, "t2": 0.0, "t3": 1.0}
        with pytest.raises(ValueError, match="phase must be one of"):
            script.verdicts(store, "x' OR 1=1 --")
    table = script.report({"shared": shared, "per-role": per_role}, start)
    lines = table.splitlines()
    assert lines[2].startswith("| shared | accuracy | 25.0% ") and "| 50.0% " in lines[2]
    assert lines[2].endswith("| +25.0 [+0.0, +75.0] |")  # t0 gained, nothing lost
    assert lines[5].startswith("| per-role | verdict accuracy | 50.0% ") and "| 75.0% " in lines[5]
    assert "| accuracy | +25.0 " in table and "| verdict accuracy | +25.0 " in table  # per-role - shared, paired
    own_start = _store(tmp_path / "own.duckdb", {"base": [(0, 0)] * 4, "final": [(1, 1)] * 4})
    alone = script.report({"a": own_start, "b": own_start})  # no --start: each store's own base evaluation
    assert "| a | accuracy | 0.0% [0.0, 0.0] (n=4) | 100.0% [100.0, 100.0] (n=4) | +100.0 [+100.0, +100.0] |" in alone
