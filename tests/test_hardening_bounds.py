"""No single bad record wedges the store (issue 20, item 2), route parameters are bounded (item 3), and the
store server refuses a bind beyond loopback without a token (item 5).

The repro of the issue: a rollout with ``max_attempts`` or ``num_attempts`` of 2**31 was accepted, and every
later write of the tables failed, then the file could not be opened again. Such numbers are now refused
when the record is built (in-process) and with 422 at the server's door; the store keeps working.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from spanlab.errors import ConfigError, InvalidSpanError
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer, check_bind
from spanlab.types import Attempt, RolloutConfig, Span, Usage

BAD_ROLLOUTS = [
    {"config": {"max_attempts": 2**31}},
    {"config": {"max_attempts": 0}},
    {"config": {"max_attempts": 1001}},
    {"num_attempts": 2**31},
    {"num_attempts": -1},
    {"config": {"timeout_s": -1}},
    {"config": {"timeout_s": 0}},
    {"config": {"unresponsive_s": 1e300}},
    {"enqueue_time": -5},
    {"num_attempts": 3, "config": {"max_attempts": 2}},
    {"num_attempts": 1000, "config": {"max_attempts": 1000}},  # its next attempt would be number 1001
    {"num_attempts": 1, "status": "requeuing"},
]
BAD_SPANS = [
    {"sequence_id": 2**31},
    {"sequence_id": -1},
    {"start_time": -1.0},
]


def _span(**extra: object) -> dict:
    return {"name": "x", "kind": "custom", **extra}


def test_numbers_are_bounded_in_the_model() -> None:
    with pytest.raises(ValidationError):
        RolloutConfig(max_attempts=2**31)
    with pytest.raises(ValidationError):
        RolloutConfig(timeout_s=float("inf"))
    with pytest.raises(ValidationError):
        RolloutConfig(timeout_s=float("nan"))
    with pytest.raises(ValidationError):
        Attempt(rollout_id="r", attempt_id="a", sequence_id=2**31)
    with pytest.raises(ValidationError):
        Usage(prompt_tokens=2**31, completion_tokens=0, total_tokens=0)
    with pytest.raises(ValidationError):
        Span(**_span(sequence_id=2**31))
    assert RolloutConfig(max_attempts=1000, timeout_s=3600).max_attempts == 1000
    assert Span(**_span(sequence_id=2**31 - 1)).sequence_id == 2**31 - 1


@pytest.mark.parametrize("bad", BAD_ROLLOUTS)
def test_bad_rollouts_are_refused_in_process_and_the_store_reopens(tmp_path: Path, bad: dict) -> None:
    db = tmp_path / "store.duckdb"
    with SpanStore(db) as store:
        with pytest.raises((InvalidSpanError, ValidationError)):
            store.enqueue([{"input": 1, **bad}])
        store.enqueue_one({"q": "ok"})
        assert store.dequeue(worker_id="w") is not None
    with SpanStore(db) as store:  # the file opens again and works
        assert len(store.list_rollouts()) == 1


def test_bad_records_get_422_from_the_server_and_the_store_keeps_working(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    with SpanStore(db) as store, ThreadedServer(create_store_app(store), name="store") as srv:
        for bad in BAD_ROLLOUTS:
            got = httpx.post(f"{srv.url}/rollouts", json=[{"input": 1, **bad}])
            assert got.status_code == 422, (bad, got.text)
        ok = httpx.post(f"{srv.url}/rollouts", json=[{"input": 1}]).json()[0]
        pair = httpx.post(f"{srv.url}/dequeue", json={}).json()
        rid, aid = pair["rollout"]["rollout_id"], pair["attempt"]["attempt_id"]
        for bad in BAD_SPANS:
            got = httpx.post(f"{srv.url}/spans", json=[_span(rollout_id=rid, attempt_id=aid, **bad)])
            assert got.status_code == 422, (bad, got.text)
        for params in ({"offset": 2**70}, {"offset": -1}, {"limit": 2**70}):
            assert httpx.get(f"{srv.url}/rollouts", params=params).status_code == 422
        assert httpx.get(f"{srv.url}/resources/x", params={"version": 2**40}).status_code == 422
        assert httpx.post(f"{srv.url}/spans", json=[_span(rollout_id=rid, attempt_id=aid)]).status_code == 200
        got = httpx.post(f"{srv.url}/attempts/{aid}/finish", json={"status": "succeeded"})
        assert got.status_code == 200 and got.json()["rollout_id"] == ok["rollout_id"]
        assert httpx.get(f"{srv.url}/rollouts").status_code == 200
    with SpanStore(db) as store:
        assert [r.status for r in store.list_rollouts()] == ["succeeded"]


def test_bind_beyond_loopback_needs_a_token_or_an_explicit_flag() -> None:
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "secret")
    check_bind("0.0.0.0", None, insecure_no_token=True)
    with pytest.raises(ConfigError, match="--insecure-no-token"):
        check_bind("0.0.0.0", None)


def test_store_serve_refuses_a_public_bind_without_a_token(tmp_path: Path) -> None:
    spanlab = str(Path(sys.executable).with_name("spanlab"))
    db = tmp_path / "store.duckdb"
    env = {k: v for k, v in os.environ.items() if k != "SPANLAB_STORE_TOKEN"}
    out = subprocess.run([spanlab, "store", "serve", "--db", str(db), "--host", "0.0.0.0", "--port", "1"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "--insecure-no-token" in out.stderr
    assert not db.exists()  # refused before the store was opened


def test_the_api_description_is_public_and_nothing_else(tmp_path: Path) -> None:
    """Documented in docs/security.md: /openapi.json and /docs hold no data and ship with the package."""
    with SpanStore(tmp_path / "s.duckdb") as store, \
            ThreadedServer(create_store_app(store, token="secret"), name="store") as srv:
        assert httpx.get(f"{srv.url}/openapi.json").status_code == 200
        assert httpx.get(f"{srv.url}/docs").status_code == 200
        for path in ("/health", "/rollouts", "/resources"):
            assert httpx.get(f"{srv.url}{path}").status_code == 401
        assert httpx.post(f"{srv.url}/sql", json={"query": "SELECT 1"}).status_code == 401


def test_spanlab_serve_refuses_a_public_store_server_without_a_token() -> None:
    from spanlab.serve import ServeConfig

    with pytest.raises(ValidationError, match="insecure_no_token"):
        ServeConfig.model_validate({"store_server": {"host": "0.0.0.0"}})
    assert ServeConfig.model_validate({"store_server": {"host": "0.0.0.0", "token": "t"}}).store_server.token == "t"
    assert ServeConfig.model_validate({"store_server": {"host": "0.0.0.0", "insecure_no_token": True}})
