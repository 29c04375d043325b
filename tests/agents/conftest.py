"""Agent fixtures: a real gateway (uvicorn on loopback) in front of the session's real vLLM, and its tokenizer.

``vllm_server`` and ``default_model_dir`` come from tests/engine_fixtures.py via the root conftest;
``SPANLAB_TEST_VLLM_URL`` reuses a running server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore


@pytest.fixture
def gateway(store: SpanStore, vllm_server: Any) -> Iterator[GatewayServer]:
    with GatewayServer(store, vllm_server.base_url) as gw:
        yield gw


@pytest.fixture(scope="session")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)
