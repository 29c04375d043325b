"""Each tutorial's ``quick.yaml`` (the few-minute try of its whole loop) runs its whole loop: every phase, every step.

The file is read as it ships and must validate as written. The run then changes where its outputs go and the
engine (the session's shared vLLM server, ``engine_url``, whose weights are restored after), and shrinks the
sizes that only make the loop longer, not different (``SMALLER`` in ``tests/jobs/quick_runs.py``): a CPU SFT
or GRPO step costs tens of seconds on 2 cores per batch of samples, and the suite must stay well under 30
minutes. Every phase and every step the file names still runs (the step counts are kept); what the run
measures is not checked (a few held-out tasks are noise), only that the loop went all the way.

Train once: calc's and drift's files ask for the same warm start (SmolLM2, the first 32 calc demonstrations,
one epoch at lr 1e-4 in batches of 8), so it runs once per session (the ``calc_warm_start`` fixture in
``tests/jobs/conftest.py``: calc's file with no GRPO step, its warm-start phase and that phase's evaluation;
``test_messages_grpo.py`` starts from it too) and both runs start from its servable folder the way
``tutorials/compare`` arms start from their start stage: ``engine.model: <folder>``, no ``warm_start``.
The calc test checks the warm-start phase on that run; the GRPO phases are each test's own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

import pytest

from spanlab.adapters.demonstrations import read_demonstrations
from spanlab.agents.calc.agent import default_template
from spanlab.config import load_yaml
from spanlab.jobs.config import TrainConfig, parse_train_config
from spanlab.jobs.job import build_algorithm, run_job
from spanlab.jobs.prompt import check_prompt
from spanlab.jobs.report import TrainReport
from spanlab.store import SpanStore
from tests.jobs.quick_runs import SMALLER, TUTORIALS, WARM_FROM_CALC, WarmStart, from_warm_start, smaller
from tests.scripts import load_script

QUICK = sorted(TUTORIALS.glob("*/quick.yaml"))


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
        data = from_warm_start(data, warm, restored_engine)
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
    if config.rollouts.seed is not None:  # calc's: every train call went to vLLM with its rollout's seed
        with SpanStore(config.db) as store:
            rows = store.query("SELECT json_extract_string(r.metadata, '$.sampling_seed') IS NOT NULL AS seeded, "
                               "json_extract_string(c.attributes, '$.request_params.seed') IS NOT NULL AS sent, "
                               "count(*) AS n FROM llm_calls c JOIN rollouts r USING (rollout_id) "
                               "WHERE r.mode = 'train' GROUP BY ALL").to_pylist()
        assert [(r["seeded"], r["sent"]) for r in rows] == [(True, True)], rows
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
