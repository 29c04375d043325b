"""``tutorials/stages.py``: how an experiment's stage is reused, continued or started over, on real folders.

A stage's subprocess is the real ``python -m spanlab train``; here its config is refused before an engine
starts (an unknown key), which is enough to see which command ran and what happened to a stopped run's files.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from spanlab.config import load_yaml
from spanlab.errors import ConfigError
from tutorials.stages import (
    deep_merge,
    from_checkpoint,
    run_stage,
    run_store,
    split_names,
    stage_state,
    start_train_tasks,
)

REPO = Path(__file__).resolve().parents[2]
BROKEN = {"algorithm": "grpo", "no_such_key": 1}  # refused by `spanlab train` at once


def _stopped(out: Path, name: str) -> None:
    """What a stage killed half-way leaves: its store with a hot file, its run folder without a report."""
    (out / name / "resume").mkdir(parents=True)
    (out / f"{name}.duckdb").write_bytes(b"")
    (out / f"{name}.duckdb.hot.sqlite").write_bytes(b"")


def test_a_finished_stage_is_reused_and_a_stopped_one_needs_resume(tmp_path: Path) -> None:
    assert stage_state(tmp_path, "grpo") == "new"
    _stopped(tmp_path, "grpo")
    assert stage_state(tmp_path, "grpo") == "partial"
    with pytest.raises(ConfigError, match=r"stopped before its end .*pass --resume"):
        run_stage("grpo", BROKEN, tmp_path)
    assert (tmp_path / "grpo.duckdb").is_file() and not (tmp_path / "configs").exists()  # nothing touched
    (tmp_path / "grpo" / "report.json").write_text(json.dumps({"seconds": 11.0}))
    assert stage_state(tmp_path, "grpo") == "done"
    assert run_stage("grpo", BROKEN, tmp_path, resume=True) == 11.0  # no subprocess: the config would fail
    (tmp_path / "grpo" / "wall.json").write_text(json.dumps({"seconds": 12.5}))
    assert run_stage("grpo", BROKEN, tmp_path) == 12.5


def test_resume_continues_grpo_and_starts_sft_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tutorials.stages")
    _stopped(tmp_path, "grpo")
    with pytest.raises(ConfigError, match=r"grpo: spanlab train exited with 2; see .*grpo\.log"):
        run_stage("grpo", BROKEN, tmp_path, resume=True)
    assert any(r.getMessage().endswith("--resume (log: " + str(tmp_path / "logs" / "grpo.log") + ")")
               for r in caplog.records)
    assert (tmp_path / "grpo" / "resume").is_dir()  # continued in place
    assert "no_such_key" in (tmp_path / "logs" / "grpo.log").read_text()

    _stopped(tmp_path, "sft")
    with pytest.raises(ConfigError, match="exited with 2"):
        run_stage("sft", {**BROKEN, "algorithm": "sft"}, tmp_path, resume=True)
    (moved,) = (tmp_path / "stopped").iterdir()
    assert moved.name.startswith("sft-") and sorted(p.name for p in moved.iterdir()) == \
        ["sft", "sft.duckdb", "sft.duckdb.hot.sqlite"]
    assert not (tmp_path / "sft.duckdb").exists()
    assert not any("--resume" in r.getMessage() for r in caplog.records if "sft" in r.getMessage())


def test_the_helpers_read_what_the_configs_and_runs_say(tmp_path: Path) -> None:
    main_job = load_yaml(REPO / "tutorials" / "calc" / "grpo.yaml")
    assert split_names(main_job) == ("test", "family", "test_l4", "family_l4", "depth")
    # the main job's warm start (512 demos of levels 1-3 among 4 levels) asks for 2 x ceil(512 x 4 / 3) tasks
    assert start_train_tasks(deep_merge(main_job, {"grpo": {"steps": 0}})) == 1366
    started = from_checkpoint(main_job, tmp_path / "final", 1366)
    assert "warm_start" not in started and started["engine"]["model"] == str(tmp_path / "final")
    assert started["grpo"]["demonstrations"] == {"demos": 512, "levels": [1, 2, 3], "coef": 1.0, "per_step": 16}
    own = deep_merge(main_job, {"grpo": {"demonstrations": {"levels": [1]}}, "warm_start": {"levels": None}})
    assert from_checkpoint(own, tmp_path, 1)["grpo"]["demonstrations"]["levels"] == [1]  # the config's own wins
    merged = deep_merge({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"c": 3}, "d": [2]})
    assert merged == {"a": {"b": 1, "c": 3}, "d": [2]}
    run = tmp_path / "runs" / "calc-ws"
    run.mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no report\.json"):
        run_store(run)
    (run / "report.json").write_text(json.dumps({"db": "runs/calc-ws.duckdb"}))  # relative to where it ran
    with pytest.raises(ConfigError, match="is not there"):
        run_store(run)
    (tmp_path / "runs" / "calc-ws.duckdb").write_bytes(b"")
    assert run_store(run) == tmp_path / "runs" / "calc-ws.duckdb"
