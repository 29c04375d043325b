"""Shared pytest fixtures for the inference engine: ONE real vLLM server per pytest session.

Import them from ``tests/conftest.py`` with ``from tests.engine_fixtures import *``.

* ``vllm_server`` (session): a :class:`~spanlab.engine.server.VLLMServer` for the default CPU
  model (SmolLM2-135M-Instruct, converted on first use), started with LoRA and the dev routes
  (weight reload) enabled, 1 GiB KV cache, ``max_model_len=4096``. It yields an object with
  ``.base_url`` (``http://127.0.0.1:PORT/v1``), ``.root_url`` and ``.model`` (the served name).
  Tests that change weights must restore them; tests that kill the engine must restart it.
* ``default_model_dir`` (session): the converted Hugging Face folder (tokenizer + weights).
* ``tiny_model_dir`` (session): a random 2-layer Llama with the default model's tokenizer and chat template
  (tests/tiny_model.py), built once. Tests of engine mechanics (start, stop, kill, restart, replicas, weight
  push) serve it: they do not depend on what the model says, and it loads and decodes several times faster.

Why the server starts early: a vLLM start is 30-55 s of one core's work while it imports and loads, and an
idle engine costs nothing; so once collection shows a test will need it, the session server starts in a
background thread (:func:`start_in_background`) and the tests that use an engine run after the others
(:func:`pytest_collection_modifyitems`), while the start runs on the second core.

Environment knobs:
* ``SPANLAB_TEST_VLLM_URL=http://127.0.0.1:8000`` reuses a server you already run (no start/stop;
  tests that need process control skip). Its served name is read from ``/v1/models`` unless
  ``SPANLAB_TEST_VLLM_MODEL`` names it. Start it with LoRA and dev routes for the weight tests.
* ``SPANLAB_TEST_MODEL`` serves another model (hub name or folder) instead of the default.
* ``SPANLAB_CACHE`` moves the model cache and server logs (default ``~/.cache/spanlab``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from spanlab.engine.config import EngineConfig
from spanlab.engine.model import DEFAULT_MODEL, ensure_default_model
from spanlab.engine.server import VLLMServer
from tests.tiny_model import build_tiny_model

__all__ = [
    "ExternalServer",
    "default_model_dir",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_sessionfinish",
    "start_in_background",
    "tiny_model_dir",
    "vllm_server",
]

logger = logging.getLogger(__name__)
ENGINE_FIXTURES = {"vllm_server", "upstream"}
_SESSION_START = pytest.StashKey[tuple[VLLMServer, Future[VLLMServer]]]()


@dataclass(frozen=True)
class ExternalServer:
    """A server somebody else runs (``SPANLAB_VLLM_URL``); same read-only surface as VLLMServer."""

    root_url: str
    model: str

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"


def start_in_background(server: VLLMServer) -> Future[VLLMServer]:
    """``server.start()`` in a thread of its own; the future's ``result()`` waits for it (and raises its error)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=f"start-{server.config.served_model_name or 'vllm'}")
    try:
        return pool.submit(server.start)
    finally:
        pool.shutdown(wait=False)  # the thread ends when the start does


def _uses_session_server(item: pytest.Item) -> bool:
    return bool(ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())))


def _uses_engine(item: pytest.Item) -> bool:
    return item.get_closest_marker("vllm") is not None or _uses_session_server(item)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering (fixture params)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use a vLLM engine run after the others (in their own order), so that the session server's
    start overlaps the others."""
    items.sort(key=_uses_engine)  # stable


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the session server now if a selected test needs it."""
    if (session.config.option.collectonly or os.environ.get("SPANLAB_TEST_VLLM_URL")
            or importlib.util.find_spec("vllm") is None
            or not any(map(_uses_session_server, session.items))):
        return
    server = VLLMServer(_session_config())
    session.config.stash[_SESSION_START] = (server, start_in_background(server))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the session server even if no test took it (all skipped, or the run was cut short)."""
    if (pending := session.config.stash.get(_SESSION_START, None)) is not None:
        server, started = pending
        wait([started])  # a start under way finishes (or fails) first
        server.stop()


def session_server(config: pytest.Config) -> VLLMServer | None:
    """The session server this run started or is starting (None when no test needs it, or it is external): for
    tools that watch the run, such as scripts/test_times.py."""
    pending = config.stash.get(_SESSION_START, None)
    return pending[0] if pending is not None else None


def _session_config() -> EngineConfig:
    return EngineConfig(model=os.environ.get("SPANLAB_TEST_MODEL", DEFAULT_MODEL), max_model_len=4096,
                        kv_cache_gib=1, enable_lora=True, dev_routes=True)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted SmolLM2 folder (converts once, ~40-60 s, then cached across sessions)."""
    return ensure_default_model()


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama's folder (seed 0; a few seconds to build), for engine-mechanics tests."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), default_model_dir, seed=0)


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest) -> Iterator[VLLMServer | ExternalServer]:
    """One vLLM server for the whole session, started at collection (above); stopped (with its whole process
    tree) at the end."""
    url = os.environ.get("SPANLAB_TEST_VLLM_URL")
    if url:
        root = url.rstrip("/").removesuffix("/v1")
        model = os.environ.get("SPANLAB_TEST_VLLM_MODEL")
        if not model:
            model = httpx.get(f"{root}/v1/models", timeout=10).json()["data"][0]["id"]
        yield ExternalServer(root_url=root, model=model)
        return
    pytest.importorskip("vllm", reason="vLLM is not installed")
    if (pending := request.config.stash.get(_SESSION_START, None)) is None:  # asked for by getfixturevalue only
        server = VLLMServer(_session_config())
        pending = request.config.stash[_SESSION_START] = (server, start_in_background(server))
    server, started = pending
    started.result()
    logger.info("session vLLM server %s ready in %.1fs, RSS %.2f GB",
                server.base_url, server.startup_s or 0.0, server.rss_bytes() / 1e9)
    try:
        yield server
    finally:
        server.stop()
