"""Each tutorial's ``quick.yaml`` (the few-minute try of its whole loop) runs as written: every phase, every step.

The file is read as it ships; only where its outputs go and the engine change: the run uses the session's
shared vLLM server (``engine_url``) instead of starting its own, and the server's weights are restored after.
What the run measures is not checked (a few held-out tasks are noise), only that the loop went all the way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spanlab.config import load_yaml
from spanlab.engine.weights import WeightSyncClient
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
QUICK = sorted(TUTORIALS.glob("*/quick.yaml"))


def test_the_tutorials_have_quick_configs() -> None:
    assert {"sql", "rooms"} <= {p.parent.name for p in QUICK}
    for path in QUICK:  # the tutorial tells its readers about it
        assert "quick.yaml" in (path.parent / "README.md").read_text(encoding="utf-8"), path


@pytest.fixture
def restored_engine(vllm_server, default_model_dir: Path) -> Iterator[str]:
    """The shared engine's URL; its weights are reloaded from the model folder when the test ends."""
    yield vllm_server.root_url
    with WeightSyncClient(vllm_server.root_url) as client:
        client.reload_weights(default_model_dir)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("path", QUICK, ids=lambda p: p.parent.name)
def test_a_quick_config_runs_the_whole_loop(path: Path, tmp_path: Path, restored_engine: str) -> None:
    data = load_yaml(path) | {"engine_url": restored_engine, "out_dir": str(tmp_path / "runs"),
                              "db": str(tmp_path / "run.duckdb")}
    config = parse_train_config(data, str(path))
    report = run_job(config)
    phases = [e.phase for e in report.evaluations if e.split == config.eval.split]
    expected = [*(["base"] if config.eval.base else []), *(["warm_start"] if config.warm_start else []), "final"]
    assert phases == expected, phases
    assert report.steps and all(e.n == config.eval.tasks and e.failed < e.n for e in report.evaluations)
    assert (config.run_dir / "report.json").is_file()
