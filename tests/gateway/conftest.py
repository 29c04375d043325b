"""Gateway fixtures: a real gateway (uvicorn on loopback) in front of the session's real vLLM.

The vLLM server is the session-wide ``vllm_server`` fixture of tests/engine_fixtures.py, which the
root tests/conftest.py must import so that every test directory shares one server (importing it here
too would start a second one). If the root does not, ``SPANLAB_TEST_VLLM_URL=http://127.0.0.1:PORT``
points these tests at a vLLM you already run; without either, the vLLM tests skip. The ``store``
(a real in-memory DuckDB store) and ``started`` (a dequeued rollout) fixtures come from the root too.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import httpx
import pytest

from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from tests.engine_fixtures import ExternalServer
from tests.gateway.helpers import Upstream


@pytest.fixture(scope="session")
def upstream(request: pytest.FixtureRequest) -> Upstream:
    try:
        return request.getfixturevalue("vllm_server")
    except pytest.FixtureLookupError:
        url = os.environ.get("SPANLAB_TEST_VLLM_URL")
        if not url:
            pytest.skip("no vLLM: import tests.engine_fixtures in tests/conftest.py or set SPANLAB_TEST_VLLM_URL")
        root = url.rstrip("/").removesuffix("/v1")
        model = httpx.get(f"{root}/v1/models", timeout=10).json()["data"][0]["id"]
        return ExternalServer(root_url=root, model=model)


@pytest.fixture
def gateway(store: SpanStore, upstream: Upstream) -> Iterator[GatewayServer]:
    with GatewayServer(store, upstream.base_url) as gw:
        yield gw


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound once, then released): an upstream that refuses connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
