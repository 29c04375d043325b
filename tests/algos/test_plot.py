"""``spanlab plot`` reads a run's metrics from the store and writes a PNG; a store without runs says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.store import SpanStore


def test_plot_writes_a_png_of_the_latest_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    db = tmp_path / "m.duckdb"
    with SpanStore(db) as store:
        store.add_metrics("run-a", "grpo", 0, {"eval_accuracy_base": 0.1})
        for step, r in enumerate([0.5, 0.6, 0.7]):
            store.add_metrics("run-a", "grpo", step, {"reward_mean": r, "reward_std": 0.5, "n_samples": 32})
        store.add_metrics("run-a", "grpo", 3, {"eval_accuracy_final": 0.8})
    out = tmp_path / "curve.png"
    result = CliRunner().invoke(app, ["plot", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000


def test_plot_reads_the_metrics_through_either_store(tmp_path: Path, any_store) -> None:
    pytest.importorskip("matplotlib")
    from spanlab.jobs.plot import latest_run_id, plot_run

    any_store.add_metrics("old", "sft", 0, {"reward_mean": 0.1})
    for step, r in enumerate([0.5, 0.6]):
        any_store.add_metrics("run-b", "grpo", step, {"reward_mean": r, "reward_std": 0.5, "n_samples": 8})
    assert latest_run_id(any_store) == "run-b"
    assert [m.value for m in any_store.metrics("run-b") if m.name == "reward_mean"] == [0.5, 0.6]
    assert plot_run(any_store, tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_runs_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    SpanStore(db).close()
    result = CliRunner().invoke(app, ["plot", "--db", str(db), "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "no training metrics" in result.output
    assert not (tmp_path / "x.png").exists()


def test_an_async_run_gets_the_off_policy_panel(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from spanlab.jobs.plot import plot_run

    with SpanStore(":memory:") as store:
        for step in range(3):
            store.add_metrics("run-a", "grpo", step, {"reward_mean": 0.5, "reward_std": 0.5, "n_samples": 8})
        plain = plot_run(store, tmp_path / "plain.png", "run-a")
        for step, (stale, dropped) in enumerate([(0.0, 0), (0.5, 4), (0.75, 0)]):
            store.add_metrics("run-b", "grpo", step, {"reward_mean": 0.5, "staleness_mean": stale,
                                                      "dropped_stale_rollouts": dropped, "tis_weight_mean": 0.98,
                                                      "mismatch_kl": 0.01})
        both = plot_run(store, tmp_path / "async.png", "run-b")
    from PIL import Image

    assert Image.open(both).height > Image.open(plain).height  # the second panel


def test_the_held_out_curve_is_a_series_over_steps_and_the_other_splits_are_bars() -> None:
    """``curve_<split>`` metrics (``eval.curve``) become one line over the steps, and that split's start and final
    accuracies are not drawn again; every other split is a group of bars, start vs end, in phase order."""
    from spanlab.jobs.plot import held_out_bars, held_out_curves

    series = {"reward_mean": {0: 0.2, 1: 0.4}, "curve_test_l4": {3: 0.5, 0: 0.1, 6: 0.8},
              "eval_accuracy_final_test_l4": {6: 0.8}, "eval_accuracy_final": {6: 0.9},
              "eval_accuracy_warm_start_test_l4": {0: 0.1}, "eval_accuracy_warm_start": {0: 0.88},
              "eval_accuracy_final_family": {6: 0.95}, "eval_accuracy_base_family": {0: 0.02},
              "eval_accuracy_warm_start_family": {0: 0.9}}
    assert held_out_curves(series) == {"test_l4": ([0, 3, 6], [0.1, 0.5, 0.8])}
    bars = held_out_bars(series, headline="test")
    assert bars == {"test": {"warm_start": 0.88, "final": 0.9},
                    "family": {"base": 0.02, "warm_start": 0.9, "final": 0.95}}
    assert list(bars["family"]) == ["base", "warm_start", "final"]


def test_the_plot_names_the_headline_split_and_labels_every_value(tmp_path: Path) -> None:
    """Close held-out values (0.878, 0.889, 0.9) each get a bar and a label of their own, in a second panel; the
    headline split's name comes from the run's held-out rollouts."""
    pytest.importorskip("matplotlib")
    from spanlab.jobs.plot import _headline_split, plot_run
    from spanlab.types import Rollout

    with SpanStore(":memory:") as store:
        for split in ("test", "family"):
            store.enqueue([Rollout(input={}, mode="test", metadata={"run_id": "run-a", "split": split})])
        for step in range(3):
            store.add_metrics("run-a", "grpo", step, {"reward_mean": 0.5, "reward_std": 0.5, "n_samples": 8})
        store.add_metrics("run-a", "grpo", 0, {"eval_accuracy_warm_start": 0.878,
                                               "eval_accuracy_warm_start_family": 0.889})
        store.add_metrics("run-a", "grpo", 3, {"eval_accuracy_final": 0.9, "eval_accuracy_final_family": 0.889})
        series = {m.name: {m.step: m.value} for m in store.metrics("run-a")}
        assert _headline_split(store, "run-a", series) == "test"
        assert _headline_split(store, "run-other", series) == "held-out"  # its rollouts do not say
        both = plot_run(store, tmp_path / "both.png", "run-a")
        store.add_metrics("run-b", "grpo", 0, {"reward_mean": 0.5})
        alone = plot_run(store, tmp_path / "alone.png", "run-b")
    from PIL import Image

    assert Image.open(both).width > Image.open(alone).width  # the bars' panel beside the training one
