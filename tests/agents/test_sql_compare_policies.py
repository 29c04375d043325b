"""tutorials/sql/compare_policies.py on small real stores (DuckDB files written through the store API, as a run
writes them): what it reads (final rewards and the role metrics of the held-out rollouts, per phase) and the
rows, rates and paired differences it prints, worked out by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from spanlab.agents.sql.roles import (
    CHECKER_ACCURACY,
    CHECKER_VERDICT,
    DRAFT_RIGHT,
    REWRITER_FIX,
    RIGHT_DRAFT_KEPT,
    WRONG_DRAFT_FIXED,
)
from spanlab.store import SpanStore
from spanlab.types import Rollout, metric_span, reward_span
from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "tutorials" / "sql" / "compare_policies.py"

# One held-out rollout: (final reward or None for a failed rollout, draft right, verdict given, verdict right,
# rewrite matched or None when no rewrite was asked for)
Outcome = tuple[float | None, int, int, int, int | None]


def _script() -> ModuleType:
    return load_script(SCRIPT, "compare_policies")


def _metrics(outcome: Outcome) -> dict[str, float]:
    final, draft, given, right, rewrite = outcome
    metrics = {DRAFT_RIGHT: draft, CHECKER_VERDICT: given, CHECKER_ACCURACY: right,
               RIGHT_DRAFT_KEPT if draft else WRONG_DRAFT_FIXED: final or 0.0}
    return {**metrics, **({} if rewrite is None else {REWRITER_FIX: rewrite})}


def _store(path: Path, phases: dict[str, list[Outcome]], train_rollouts: int = 0) -> Path:
    """Held-out rollouts per phase for tasks t0, t1, ..., each with its final reward and its role metrics."""
    with SpanStore(path) as store:
        for phase, outcomes in phases.items():
            for i, outcome in enumerate(outcomes):
                store.enqueue([Rollout(input={"task_id": f"t{i}"}, mode="test",
                                       metadata={"phase": phase, "split": "test"})])
                got = store.dequeue(worker_id="w")
                assert got is not None
                rid, aid = got[0].rollout_id, got[1].attempt_id
                spans = [metric_span(rid, aid, name, value) for name, value in _metrics(outcome).items()]
                if outcome[0] is not None:
                    spans.append(reward_span(rid, aid, outcome[0]))
                store.add_spans(spans)
                store.finish_attempt(aid, "succeeded" if outcome[0] is not None else "failed")
        for _ in range(train_rollouts):  # training rollouts are never read as held-out scores
            store.enqueue([Rollout(input={"task_id": "t0"}, mode="train")])
            got = store.dequeue(worker_id="w")
            assert got is not None
            store.add_spans([reward_span(got[0].rollout_id, got[1].attempt_id, 1.0)])
            store.finish_attempt(got[1].attempt_id, "succeeded")
    return path


NOTHING: Outcome = (0.0, 0, 0, 0, 0)


def test_three_rows_from_one_start_and_the_arms_paired(tmp_path: Path) -> None:
    script = _script()
    warm = _store(tmp_path / "warm.duckdb", {
        "base": [NOTHING] * 4,
        "warm_start": [(0.0, 0, 1, 1, 0), (1.0, 1, 1, 1, None), (0.0, 0, 0, 0, 0), (1.0, 0, 1, 1, 1)],
    })
    shared = _store(tmp_path / "shared.duckdb", {
        "final": [(0.0, 0, 1, 1, 0), (0.0, 1, 1, 0, 0), (0.0, 0, 1, 1, 0), (1.0, 0, 1, 1, 1)],
    }, train_rollouts=3)
    per_role = _store(tmp_path / "per_role.duckdb", {
        "final": [(1.0, 0, 1, 1, 1), (1.0, 1, 1, 1, None), (1.0, 1, 1, 1, None), (None, 0, 0, 0, None)],
    })
    with SpanStore(warm) as store:
        start = script.scores(store, "warm_start")
        assert start["accuracy"] == {"t0": 0.0, "t1": 1.0, "t2": 0.0, "t3": 1.0}
        assert start[REWRITER_FIX] == {"t0": 0.0, "t2": 0.0, "t3": 1.0}  # t1: no rewrite asked for
        assert script.scores(store, "final") == {}
    with SpanStore(per_role) as store:
        assert script.scores(store, "final")["accuracy"]["t3"] == 0.0  # a failed rollout scores 0
    table = script.report({"shared": shared, "per role": per_role}, warm)
    lines = table.splitlines()

    def row(label: str, metric: str) -> str:
        (line,) = [x for x in lines if x.startswith(f"| {label} | {metric} |")]
        return line

    assert row("warm start only", "accuracy") == (
        "| warm start only | accuracy | 0.0% [0.0, 0.0] (n=4) | 50.0% [0.0, 100.0] (n=4) "
        "| +50.0 [+0.0, +100.0] (n=4) |")
    assert "| 0.0% [0.0, 0.0] (n=4) | 75.0% " in row("warm start only", "checker gives a verdict")
    # the arms start where the warm start ended, task by task
    assert row("shared", "accuracy").startswith("| shared | accuracy | 50.0% [0.0, 100.0] (n=4) | 25.0% ")
    assert row("shared", "accuracy").endswith("| -25.0 [-75.0, +0.0] (n=4) |")  # t1 lost, nothing gained
    assert row("per role", "accuracy").endswith("| +25.0 [-50.0, +100.0] (n=4) |")  # t0, t2 gained; t3 failed
    assert "| 75.0% [25.0, 100.0] (n=4) | 75.0% [25.0, 100.0] (n=4) | +0.0 [" in row("per role",
                                                                                     "checker gives a verdict")
    # rates over the rollouts they are about: counts, no pairing
    assert row("shared", "rewrites that match gold") == (
        "| shared | rewrites that match gold | 33.3% (1/3) | 25.0% (1/4) | not paired (other rollouts) |")
    assert row("shared", "right drafts kept").split(" | ")[2:4] == ["100.0% (1/1)", "0.0% (0/1)"]
    assert row("per role", "wrong drafts fixed").split(" | ")[2:4] == ["33.3% (1/3)", "50.0% (1/2)"]
    assert row("per role", "right drafts kept").split(" | ")[2:4] == ["100.0% (1/1)", "100.0% (2/2)"]
    assert row("warm start only", "rewrites that match gold").split(" | ")[2:4] == ["0.0% (0/4)", "33.3% (1/3)"]
    # per role - shared at the end, paired by task: t0, t1, t2 gained; t3 lost
    assert "| accuracy | +50.0 " in table and "| per role - shared at the end" in table


def test_each_arm_from_its_own_start_without_a_common_one(tmp_path: Path) -> None:
    script = _script()
    own = _store(tmp_path / "own.duckdb", {"base": [NOTHING] * 4, "final": [(1.0, 1, 1, 1, None)] * 4})
    warm = _store(tmp_path / "warm.duckdb", {"base": [NOTHING] * 4, "warm_start": [(1.0, 1, 1, 1, None)] * 4,
                                             "final": [(1.0, 1, 1, 1, None)] * 4})
    table = script.report({"a": own, "b": warm})
    assert "warm start only" not in table
    assert "| a | accuracy | 0.0% [0.0, 0.0] (n=4) | 100.0% [100.0, 100.0] (n=4) | +100.0 [+100.0, +100.0] (n=4) |" \
        in table
    assert "| b | accuracy | 100.0% [100.0, 100.0] (n=4) | 100.0% [100.0, 100.0] (n=4) | +0.0 [+0.0, +0.0] (n=4) |" \
        in table  # its warm start, not its base, is its start


def test_a_missing_store_or_phase_is_a_one_line_error(tmp_path: Path) -> None:
    unfinished = _store(tmp_path / "unfinished.duckdb", {"base": [NOTHING]})
    cases = [([str(tmp_path / "nope.duckdb"), str(unfinished)], "nope.duckdb: no such store"),
             ([str(unfinished), str(unfinished)], "no held-out evaluation of phase final"),
             ([str(unfinished), str(unfinished), "--start", str(unfinished)],
              "no held-out evaluation of phase warm_start")]
    for args, message in cases:
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
    with pytest.raises(ValueError, match="phase final"):
        _script().rows({"a": unfinished})


def test_an_arm_with_its_own_warm_start_starts_there_and_its_curve_counts_tasks_moved(tmp_path: Path) -> None:
    script = _script()
    right, wrong = (1.0, 1, 1, 1, None), NOTHING
    per_role = _store(tmp_path / "per_role.duckdb", {
        "base": [wrong] * 4,
        "warm_start": [right, wrong, wrong, wrong],
        "step-3": [right, wrong, wrong, wrong],   # nothing moved yet
        "step-6": [wrong, right, right, wrong],   # t1, t2 gained, t0 lost
        "final": [right, right, right, wrong],
    })
    shared = _store(tmp_path / "shared.duckdb", {"warm_start": [wrong] * 4, "final": [wrong, right, wrong, wrong]})
    with SpanStore(per_role) as store:
        assert script.curve_phases(store) == ["base", "warm_start", "step-3", "step-6", "final"]
        start = script.start_scores(store)["accuracy"]  # the warm start's, not the base's
        assert script.decisions_moved(store, start) == [
            ("step-3", 0.25, 0, 0), ("step-6", 0.5, 2, 1), ("final", 0.75, 2, 0)]
    table = script.report({"shared": shared, "per role": per_role}, per_role)
    lines = table.splitlines()
    # shared starts from its own warm start (0/4), not from the --start store's (1/4)
    (shared_acc,) = [x for x in lines if x.startswith("| shared | accuracy |")]
    assert shared_acc.split(" | ")[2] == "0.0% [0.0, 0.0] (n=4)" and "| +25.0 [" in shared_acc
    assert "| per role | step-6 | 50.0% | 2 | 1 |" in lines and "| shared | final | 25.0% | 1 | 0 |" in lines
    # the ends: per role 3/4, shared 1/4 (+50); the gains: per role +50 from 1/4, shared +25 from 0/4 (+25)
    (acc,) = [x for x in lines if x.startswith("| accuracy | ")]
    assert acc.startswith("| accuracy | +50.0 [") and "| +25.0 [" in acc.split("(n=4)")[1]
