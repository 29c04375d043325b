"""Fixtures of the job tests: the shared engine with its weights restored after a test, and the calc warm start
that the quick-config and Messages-API GRPO tests share (trained once per session, not once per module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spanlab.engine.weights import WeightSyncClient
from tests.jobs.quick_runs import SQL_POLICIES, WarmStart, train_calc_warm_start


@pytest.fixture
def restored_engine(vllm_server, default_model_dir: Path) -> Iterator[str]:
    """The shared engine's URL; its weights are reloaded from the model folder when the test ends."""
    yield vllm_server.root_url
    with WeightSyncClient(vllm_server.root_url) as client:
        client.reload_weights(default_model_dir)


@pytest.fixture
def policies_engine(restored_engine: str) -> Iterator[str]:
    """The shared engine's URL for a job with :data:`SQL_POLICIES`; afterwards its base weights are reloaded and
    the policies' adapters unloaded."""
    yield restored_engine
    with WeightSyncClient(restored_engine) as client:
        for name in (SQL_POLICIES["roles"]["writer"], SQL_POLICIES["default"]):
            client.unload_lora(name)


@pytest.fixture(scope="session")
def calc_warm_start(vllm_server, default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> WarmStart:
    """calc's quick.yaml up to its warm start, once per session (:func:`train_calc_warm_start`)."""
    return train_calc_warm_start(vllm_server.root_url, default_model_dir, tmp_path_factory.mktemp("calc-warm-start"))
