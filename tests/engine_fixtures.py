"""Shared pytest fixtures for the inference engine: ONE real vLLM server per pytest session.

Import them from ``tests/conftest.py`` with ``from tests.engine_fixtures import *``.

* ``vllm_server`` (session): a :class:`~spanlab.engine.server.VLLMServer` for the default CPU
  model (SmolLM2-135M-Instruct, converted on first use), started with LoRA and the dev routes
  (weight reload) enabled, 1 GiB KV cache, ``max_model_len=4096``. It yields an object with
  ``.base_url`` (``http://127.0.0.1:PORT/v1``), ``.root_url`` and ``.model`` (the served name).
  Tests that change weights must restore them; tests that kill the engine must restart it.
* ``default_model_dir`` (session): the converted Hugging Face folder (tokenizer + weights).

Environment knobs:
* ``SPANLAB_TEST_VLLM_URL=http://127.0.0.1:8000`` reuses a server you already run (no start/stop;
  tests that need process control skip). Its served name is read from ``/v1/models`` unless
  ``SPANLAB_TEST_VLLM_MODEL`` names it. Start it with LoRA and dev routes for the weight tests.
* ``SPANLAB_TEST_MODEL`` serves another model (hub name or folder) instead of the default.
* ``SPANLAB_CACHE`` moves the model cache and server logs (default ``~/.cache/spanlab``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from spanlab.engine.config import EngineConfig
from spanlab.engine.model import DEFAULT_MODEL, ensure_default_model
from spanlab.engine.server import VLLMServer

__all__ = ["ExternalServer", "default_model_dir", "vllm_server"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExternalServer:
    """A server somebody else runs (``SPANLAB_VLLM_URL``); same read-only surface as VLLMServer."""

    root_url: str
    model: str

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted SmolLM2 folder (converts once, ~40-60 s, then cached across sessions)."""
    return ensure_default_model()


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VLLMServer | ExternalServer]:
    """One vLLM server for the whole session; stopped (with its whole process tree) at the end."""
    url = os.environ.get("SPANLAB_TEST_VLLM_URL")
    if url:
        root = url.rstrip("/").removesuffix("/v1")
        model = os.environ.get("SPANLAB_TEST_VLLM_MODEL")
        if not model:
            model = httpx.get(f"{root}/v1/models", timeout=10).json()["data"][0]["id"]
        yield ExternalServer(root_url=root, model=model)
        return
    pytest.importorskip("vllm", reason="vLLM is not installed")
    config = EngineConfig(
        model=os.environ.get("SPANLAB_TEST_MODEL", DEFAULT_MODEL),
        max_model_len=4096,
        kv_cache_gib=1,
        enable_lora=True,
        dev_routes=True,
    )
    server = VLLMServer(config)
    server.start()
    logger.info("session vLLM server %s ready in %.1fs, RSS %.2f GB",
                server.base_url, server.startup_s or 0.0, server.rss_bytes() / 1e9)
    try:
        yield server
    finally:
        server.stop()
