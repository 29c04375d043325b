"""Each tutorial's ``quick.yaml`` (the few-minute try of its whole loop) runs its whole loop: every phase, every step.

The file is read as it ships and must validate as written. The run then changes where its outputs go and the
engine (the session's shared vLLM server, ``engine_url``, whose weights are restored after), and shrinks the
sizes that only make the loop longer, not different (:data:`SMALLER`): a CPU SFT or GRPO step costs tens of
seconds on 2 cores per batch of samples, and the suite must stay well under 30 minutes. Every phase and every
step the file names still runs (the step counts are kept); what the run measures is not checked (a few
held-out tasks are noise), only that the loop went all the way.

Train once: calc's and drift's files ask for the same warm start (SmolLM2, the first 32 calc demonstrations,
one epoch at lr 1e-4 in batches of 8), so it runs once per session (:func:`calc_warm_start`: calc's file with no
GRPO step, its warm-start phase and that phase's evaluation) and both runs start from its servable folder the
way ``tutorials/compare`` arms start from their start stage: ``engine.model: <folder>``, no ``warm_start``.
The calc test checks the warm-start phase on that run; the GRPO phases are each test's own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from spanlab.adapters.demonstrations import read_demonstrations
from spanlab.agents.calc.agent import default_template
from spanlab.config import load_yaml
from spanlab.engine.weights import WeightSyncClient
from spanlab.jobs.config import TrainConfig, parse_train_config
from spanlab.jobs.job import build_algorithm, run_job
from spanlab.jobs.prompt import check_prompt
from spanlab.jobs.report import TrainReport
from spanlab.store import SpanStore
from tests.scripts import load_script

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
QUICK = sorted(TUTORIALS.glob("*/quick.yaml"))
# Per tutorial, the sections whose sizes the test lowers (merged key by key into the file's own): fewer GRPO
# samples per step, fewer held-out tasks (one per level), fewer SFT round tasks, rooms' answer turn capped at 32
# tokens (it ran to its 128 in most rollouts, and each APO batch waits for its slowest decode). The shared calc
# warm start keeps its 4 steps (drift's check, every step drifts, needs the tool calls it teaches; one step of 8
# demos was enough for calc alone). drift runs 8 samples per step: at the shipped 16, 14 and 15 of each step's
# samples drifted, at 8 all 8 did.
SMALLER: dict[str, dict[str, dict[str, Any]]] = {
    "calc": {"grpo": {"tasks_per_step": 2, "group_size": 2}, "eval": {"tasks": 3}},
    "drift": {"grpo": {"tasks_per_step": 2}, "eval": {"tasks": 3}},
    "rooms": {"eval": {"tasks": 2}, "agent": {"kwargs": {"answer_max_tokens": 32}}},
    "sql": {"sft": {"tasks_per_round": 2}},
}


def _merged(data: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``sizes`` merged in key by key, into nested mappings too (an agent's ``kwargs``)."""
    return data | {key: _merged(data.get(key) or {}, value) if isinstance(value, dict) else value
                   for key, value in sizes.items()}


def smaller(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the test's sizes for tutorial ``name`` merged into its sections."""
    return _merged(data, SMALLER.get(name, {}))


def test_the_smaller_sizes_keep_every_phase_and_step() -> None:
    """What the test shrinks leaves each file's phases and step counts as written (and the file valid)."""
    assert set(SMALLER) <= {p.parent.name for p in QUICK}
    for path in QUICK:
        data = load_yaml(path)
        written, run = parse_train_config(data, str(path)), parse_train_config(smaller(path.parent.name, data), "x")
        assert (written.algorithm, written.eval.base, written.eval.split, written.warm_start is None) == \
               (run.algorithm, run.eval.base, run.eval.split, run.warm_start is None), path
        section = written.algorithm
        for key in ("steps", "rounds"):
            assert data.get(section, {}).get(key) == smaller(path.parent.name, data)[section].get(key), path


def test_the_tutorials_have_quick_configs() -> None:
    assert {"sql", "rooms", "calc", "drift"} <= {p.parent.name for p in QUICK}
    for path in QUICK:  # the tutorial tells its readers about it
        assert "quick.yaml" in (path.parent / "README.md").read_text(encoding="utf-8"), path


@pytest.fixture
def restored_engine(vllm_server, default_model_dir: Path) -> Iterator[str]:
    """The shared engine's URL; its weights are reloaded from the model folder when the test ends."""
    yield vllm_server.root_url
    with WeightSyncClient(vllm_server.root_url) as client:
        client.reload_weights(default_model_dir)


# The tutorials whose runs start from the shared warm start (:func:`calc_warm_start`) instead of their own.
WARM_FROM_CALC = ("calc", "drift")


@dataclass(frozen=True)
class WarmStart:
    """The shared warm start's run: its report and its servable folder (``runs/calc-quick/final``)."""

    report: TrainReport
    folder: Path
    settings: dict[str, Any]  # the warm_start section it ran


def _warm_start_section(name: str) -> dict[str, Any]:
    return load_yaml(TUTORIALS / name / "quick.yaml")["warm_start"]


@pytest.fixture(scope="module")
def calc_warm_start(vllm_server, default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                    ) -> Iterator[WarmStart]:
    """calc's quick.yaml up to its warm start, once: no GRPO step, so the run is the warm start, its held-out
    evaluation and the final folder. The engine's weights are the base model's again afterwards."""
    assert all(_warm_start_section(n) == _warm_start_section("calc") for n in WARM_FROM_CALC), \
        "the tutorials sharing the calc warm start must ask for the same one"
    out = tmp_path_factory.mktemp("calc-warm-start")
    data = smaller("calc", load_yaml(TUTORIALS / "calc" / "quick.yaml"))
    data = _merged(data, {"grpo": {"steps": 0}}) | {"engine_url": vllm_server.root_url, "out_dir": str(out / "runs"),
                                                     "db": str(out / "run.duckdb")}
    config = parse_train_config(data, "calc/quick.yaml up to its warm start")
    try:
        report = run_job(config)
    finally:
        with WeightSyncClient(vllm_server.root_url) as client:
            client.reload_weights(default_model_dir)
    yield WarmStart(report, config.run_dir / "final", data["warm_start"])


def _from_warm_start(data: dict[str, Any], warm: WarmStart, engine_url: str) -> dict[str, Any]:
    """``data`` starting from the shared warm start's folder (served by the engine now) with no warm start of its
    own; the train tasks are the ones that run generated, as the compare tutorial's arms take their start's."""
    with WeightSyncClient(engine_url) as client:
        client.reload_weights(warm.folder)
    dataset = {**data["dataset"], "train_tasks": 2 * int(warm.settings["demos"])}
    return {key: value for key, value in data.items() if key != "warm_start"} | {
        "engine": {**data["engine"], "model": str(warm.folder)}, "dataset": dataset}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("path", QUICK, ids=lambda p: p.parent.name)
def test_a_quick_config_runs_the_whole_loop(path: Path, tmp_path: Path, restored_engine: str,
                                           request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(TUTORIALS.parent)  # relative paths in a config (a template) are the repo root's, as documented
    name = path.parent.name
    written = load_yaml(path)
    parse_train_config(written, str(path))  # the file as it ships is a valid config
    data = smaller(name, written) | {"engine_url": restored_engine, "out_dir": str(tmp_path / "runs"),
                                     "db": str(tmp_path / "run.duckdb")}
    warm: WarmStart | None = None
    if name in WARM_FROM_CALC:
        warm = request.getfixturevalue("calc_warm_start")
        assert data["warm_start"] == warm.settings  # the run it skips is the one the shared warm start made
        data = _from_warm_start(data, warm, restored_engine)
    config = parse_train_config(data, str(path))
    caplog.set_level(logging.INFO, logger="spanlab.progress")
    report = run_job(config)  # output is not a terminal here: the phases log plain progress lines
    phases = [e.phase for e in report.evaluations if e.split == config.eval.split]
    expected = [*(["base"] if config.eval.base else []), *(["warm_start"] if config.warm_start else []), "final"]
    assert phases == expected, phases
    assert report.steps and all(e.n == config.eval.tasks and e.failed < e.n for e in report.evaluations)
    assert (config.run_dir / "report.json").is_file()
    progress = [r.getMessage() for r in caplog.records if r.name == "spanlab.progress"]
    evaluated = [line for line in progress if line.startswith(f"final eval {config.eval.split}: ")]
    assert evaluated and evaluated[-1].startswith(f"final eval {config.eval.split}: {config.eval.tasks}/"
                                                  f"{config.eval.tasks} (100%) accuracy "), progress
    assert all(" elapsed, ETA " in line for line in progress)
    if config.algorithm in ("grpo", "sft"):  # the step loop's bar, to its end
        assert any(line.startswith(("GRPO: ", "SFT rounds: ")) and "(100%)" in line for line in progress), progress
    if config.retokenize_template is not None:  # the drift tutorial: a mismatched template drifts in every step
        assert all(step["drift_sample_frac"] > 0 for step in report.steps), report.steps
    if name == "calc" and warm is not None:  # calc's own warm-start phase: the shared run's, in full
        assert [(e.phase, e.split) for e in warm.report.evaluations] == [("warm_start", config.eval.split)]
        assert all(e.n == config.eval.tasks and e.failed < e.n for e in warm.report.evaluations)
        assert warm.report.warm_start is not None and warm.report.warm_start["sft_steps"] == \
            -(-warm.settings["demos"] // warm.settings["batch_size"]) * warm.settings["epochs"]
        assert not warm.report.steps and (warm.folder / "config.json").is_file()
        _check_demonstrations(warm, config, report)


def _check_demonstrations(warm: WarmStart, config: TrainConfig, report: TrainReport) -> None:
    """Every demonstration a run trained on is in its store: the warm start's as it recorded them, and the ones
    calc's GRPO term generated (it starts from the warm start's folder with none stored) and drew each update."""
    with SpanStore(warm.report.db) as store:
        assert len(read_demonstrations(store, run_id=warm.report.run_id, sources=["warm_start"])) == \
            warm.settings["demos"]
    term = build_algorithm(config).settings.demonstrations
    with SpanStore(config.db) as store:
        rows = store.query("SELECT source, count(*) AS n FROM demonstrations GROUP BY 1").to_pylist()
    assert rows == [{"source": "grpo.demonstrations", "n": term.demos}], rows
    updated = [step for step in report.steps if not step["skipped"]]
    assert all(step["demo_samples"] == term.per_step and step["demo_nll"] > 0 for step in updated), updated


def _compare_script() -> ModuleType:
    return load_script(TUTORIALS / "compare" / "run.py", "compare_run")


def test_the_quick_comparison_stages_are_valid_configs(tmp_path: Path, default_model_dir: Path) -> None:
    """``tutorials/compare/run.py --quick``: every stage's config, built on calc's quick.yaml at the quick sizes,
    passes the checks ``spanlab train`` runs before an engine starts, and the budget sets each arm's size."""
    run = _compare_script()
    (tmp_path / "start").mkdir()
    (tmp_path / "start" / "final").symlink_to(default_model_dir)  # what the start stage leaves for the arms
    (tmp_path / "apo").mkdir()  # ... and the APO stage for the last arm: here the agent's own prompt
    (tmp_path / "apo" / "winner.poml").write_text(default_template())
    base = load_yaml(run.QUICK_BASE)
    sizes = {}
    for name in run.STAGES:
        data = run.stage_config(name, base, tmp_path, run.QUICK["budget"], run.QUICK["eval_tasks"])
        config = parse_train_config(data, f"{name}.yaml")
        build_algorithm(config)
        check_prompt(config)
        assert config.eval.tasks == run.QUICK["eval_tasks"] and config.eval.base == (name in ("start", "apo"))
        section = data.get(config.algorithm, {})
        sizes[name] = {k: section.get(k) for k in ("steps", "rounds", "max_rollouts")}
    assert sizes["start"]["steps"] == 0 and sizes["grpo"]["steps"] == 2 and sizes["sft"]["rounds"] == 2
    assert sizes["apo"]["max_rollouts"] == run.QUICK["budget"]
