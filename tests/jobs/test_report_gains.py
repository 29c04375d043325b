"""The report's paired gain: final vs its start (warm start, else base) over the same held-out tasks."""

from __future__ import annotations

import json
from pathlib import Path

from spanlab.jobs.report import Evaluation, TrainReport


def _ev(phase: str, split: str, rewards: list[float]) -> Evaluation:
    return Evaluation(phase=phase, split=split, n=len(rewards), accuracy=sum(rewards) / len(rewards), rewards=rewards)


def _report(*evaluations: Evaluation) -> TrainReport:
    return TrainReport(run_name="r", algorithm="sft", model="m", db="d", evaluations=list(evaluations))


def test_the_gain_is_paired_against_the_warm_start_and_says_whether_it_excludes_zero(tmp_path: Path) -> None:
    base = [0.0] * 40
    start = [1.0] * 20 + [0.0] * 20
    gained = [1.0] * 30 + [0.0] * 10  # 10 more tasks right, none lost
    shuffled = [0.0] * 10 + [1.0] * 30  # the same accuracy as `gained`, reached on other tasks
    report = _report(_ev("base", "test", base), _ev("warm_start", "test", start), _ev("final", "test", gained),
                     _ev("base", "family", base), _ev("warm_start", "family", start),
                     _ev("final", "family", shuffled))

    test, family = report.paired_gains()
    assert (test.split, test.start, test.n) == ("test", "warm_start", 40)
    assert test.diff == 0.25 and 0 < test.low <= test.diff <= test.high and test.excludes_zero
    # Same accuracy gain, but 10 tasks lost and 20 gained: the paired interval is wider.
    assert family.diff == 0.25 and family.low < test.low and family.high > test.high

    report.write(tmp_path / "report.json")
    again = TrainReport.model_validate(json.loads((tmp_path / "report.json").read_text()))
    assert again.paired_gains() == report.paired_gains()
    assert report.summary()["paired_gains"][0]["diff"] == 0.25
    assert report.gains_table().row_count == 2


def test_without_a_warm_start_the_start_is_the_base_and_unpaired_splits_are_left_out() -> None:
    no_ws = _report(_ev("base", "test", [0.0, 1.0, 0.0]), _ev("final", "test", [1.0, 1.0, 0.0]))
    (gain,) = no_ws.paired_gains()
    assert gain.start == "base" and abs(gain.diff - 1 / 3) < 1e-12

    old = Evaluation(phase="base", split="test", n=3, accuracy=0.3)  # a report from before rewards were kept
    assert _report(old, _ev("final", "test", [1.0, 1.0, 0.0])).paired_gains() == []
    assert _report(_ev("base", "test", [1.0, 0.0]), _ev("final", "test", [1.0, 1.0, 0.0])).paired_gains() == []
    assert _report(_ev("base", "test", [1.0, 0.0])).paired_gains() == []  # no final evaluation


def test_the_learning_curve_lines_up_each_policy_with_its_rollouts_and_evaluations() -> None:
    """Row k is the policy after k steps: step k + 1's train reward, and the held-out splits evaluated then."""
    report = _report(_ev("base", "test_l4", [0.0] * 4), _ev("warm_start", "test_l4", [0.0, 0.0, 0.0, 1.0]),
                     _ev("warm_start", "test", [1.0] * 4), _ev("step-2", "test_l4", [0.0, 1.0, 1.0, 1.0]),
                     _ev("final", "test_l4", [1.0] * 4), _ev("final", "test", [1.0] * 4))
    report.steps = [{"reward_mean": 0.1, "n_groups": 16, "n_groups_with_signal": 3},
                    {"reward_mean": 0.3, "n_groups": 16, "n_groups_with_signal": 9},
                    {"reward_mean": 0.6, "n_groups": 16, "n_groups_with_signal": 12}]
    rows = report.curve()
    assert [(r["steps"], r["updates"], r["train_reward"], r["test_l4"]) for r in rows] == [
        (0, 0, 0.1, 0.25), (1, 1, 0.3, None), (2, 2, 0.6, 0.75), (3, 3, None, 1.0)]
    assert all("test" not in r for r in rows)  # evaluated only at the ends: not a curve
    assert report.curve_table().row_count == 4


def test_the_learning_curve_counts_updates_not_steps() -> None:
    """A step with no reward variance changed nothing: the policy after it is the one before, and says so."""
    report = _report(_ev("warm_start", "test", [0.0, 1.0]), _ev("final", "test", [1.0, 1.0]))
    report.steps = [{"reward_mean": 1.0, "skipped": 1.0}, {"reward_mean": 0.5, "skipped": 0.0}]
    assert [(r["steps"], r["updates"]) for r in report.curve()] == [(0, 0), (1, 0), (2, 1)]
    table = report.curve_table()
    assert [c.header for c in table.columns][:2] == ["steps", "updates"]
    assert list(table.columns[1].cells) == ["0", "0", "1"]
