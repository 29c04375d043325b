"""The report's time table: where a run's wall time went, part by part, summing to the run's seconds."""

from __future__ import annotations

from spanlab.jobs.report import Evaluation, TrainReport


def test_phase_seconds_split_the_run_into_its_parts_and_sum_to_it() -> None:
    evaluations = [Evaluation(phase=phase, split=split, n=1, accuracy=1.0, seconds=seconds)
                   for phase, split, seconds in (("warm_start", "test", 60.0), ("warm_start", "family", 40.0),
                                                 ("step-3", "test_l4", 30.0), ("final", "test", 70.0))]
    steps = [{"rollout_s": 100.0, "step_s": 50.0, "sync_s": 5.0}, {"rollout_s": 120.0, "step_s": 55.0, "sync_s": 5.0}]
    report = TrainReport(run_name="r", algorithm="grpo", model="m", db="d", evaluations=evaluations,
                         warm_start={"sft_steps": 64.0, "seconds": 300.0}, steps=steps, seconds=1000.0)

    parts = report.phase_seconds()
    assert parts == {"warm start": 300.0, "evaluation warm_start": 100.0, "evaluation step-3": 30.0,
                     "evaluation final": 70.0, "rollouts": 220.0, "updates": 105.0, "weight pushes": 10.0,
                     "other": 165.0}
    assert sum(parts.values()) == report.seconds
    assert report.times_table().row_count == len(parts)
    assert report.summary()["phase_seconds"]["rollouts"] == 220


def test_a_run_without_a_warm_start_or_steps_shows_only_what_it_had() -> None:
    report = TrainReport(run_name="r", algorithm="apo", model="m", db="d", seconds=50.0,
                         evaluations=[Evaluation(phase="base", split="test", n=1, accuracy=0.0, seconds=20.0)])
    assert report.phase_seconds() == {"evaluation base": 20.0, "other": 30.0}
