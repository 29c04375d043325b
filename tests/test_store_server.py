"""The store server over real HTTP (`spanlab store serve` in a subprocess) and its client."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spanlab.errors import InvalidSpanError, NotFoundError, QueryError, StoreError
from spanlab.store.client import StoreClient
from spanlab.types import Rollout, RolloutConfig, reward_span
from tests.conftest import llm_span
from tests.stores import TOKEN, ServerProcess, free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("srv") / "store.duckdb", free_port(), "--max-body-mb", "1")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[StoreClient]:
    with StoreClient(server.url, token=TOKEN, retry_for_s=5) as c:
        yield c


def test_token_is_required(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 401
    assert httpx.get(f"{server.url}/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    with pytest.raises(StoreError, match="refused"):
        StoreClient(server.url, token="wrong").list_rollouts()


def test_client_speaks_the_store_api(client: StoreClient) -> None:
    r = client.enqueue_one({"q": "2+2"}, mode="val", config=RolloutConfig(max_attempts=2))
    rollout, attempt = client.dequeue(worker_id="remote", mode="val")
    assert rollout.rollout_id == r.rollout_id and attempt.worker_id == "remote"
    assert client.heartbeat(attempt.attempt_id).status == "running"
    spans = [llm_span(rollout, attempt, n_prompt=300, seed=i) for i in range(4)]
    assert client.add_spans(spans) == 4
    assert client.add_spans(spans) == 0  # retried write: deduplicated on the server
    table = client.spans_table(attempt_ids=[attempt.attempt_id], columns=["span_id", "prompt_token_ids"])
    assert table["span_id"].to_pylist() == [s.span_id for s in spans]
    assert table["prompt_token_ids"].to_pylist() == [s.llm.prompt_token_ids for s in spans]
    typed = list(client.iter_spans(attempt_ids=[attempt.attempt_id]))
    assert [s.llm.response_token_ids for s in typed] == [s.llm.response_token_ids for s in spans]
    assert client.finish_attempt(attempt.attempt_id, "failed").status == "requeuing"
    assert [a.status for a in client.list_attempts(r.rollout_id)] == ["failed"]
    assert client.get_rollout(r.rollout_id).num_attempts == 1
    v = client.add_resource("prompt", {"text": "be brief"}, kind="prompt_template")
    assert client.get_resource("prompt").version == v.version
    rows = client.query(f"SELECT llm_calls FROM rollout_summary WHERE rollout_id = '{r.rollout_id}'").to_pylist()
    assert rows == [{"llm_calls": 4}]
    assert client.spans_table(kinds=["no-such-kind"]).num_rows == 0


def test_finish_with_the_last_spans_over_http(server: ServerProcess, client: StoreClient) -> None:
    client.enqueue([Rollout(input={"i": i}, mode="test") for i in range(2)])
    (r1, a1), (r2, a2) = client.dequeue(mode="test"), client.dequeue(mode="test")
    calls = [llm_span(r1, a1, n_prompt=500, seed=i) for i in range(3)]
    done = client.finish_attempt(a1.attempt_id, "succeeded", [*calls, reward_span(r1.rollout_id, a1.attempt_id, 0.5)])
    assert done.status == "succeeded"
    table = client.spans_table(attempt_ids=[a1.attempt_id], columns=["span_id", "prompt_token_ids", "reward_value"])
    assert table["prompt_token_ids"].to_pylist()[:3] == [s.llm.prompt_token_ids for s in calls]
    assert table["reward_value"].to_pylist() == [None, None, None, 0.5]
    with pytest.raises(InvalidSpanError, match="spans of attempt"):
        client.finish_attempt(a2.attempt_id, "failed", [reward_span(r1.rollout_id, a1.attempt_id, 1.0)])
    # the JSON route, for clients without Arrow
    auth = {"Authorization": f"Bearer {TOKEN}"}
    reward = reward_span(r2.rollout_id, a2.attempt_id, 1.0).model_dump(mode="json")
    got = httpx.post(f"{server.url}/attempts/{a2.attempt_id}/finish", json={"status": "succeeded", "spans": [reward]},
                     headers=auth)
    assert got.status_code == 200 and got.json()["status"] == "succeeded"
    rewards = client.spans_table(attempt_ids=[a2.attempt_id], columns=["reward_value"])["reward_value"]
    assert rewards.to_pylist() == [1.0]
    bad = httpx.post(f"{server.url}/attempts/{a2.attempt_id}/finish/arrow", params={"status": "done"}, content=b"x",
                     headers=auth)
    assert bad.status_code == 422 and "status" in bad.text


def test_record_batches_larger_than_an_http_chunk_read_back_whole(client: StoreClient) -> None:
    """A 300 KB record batch spans many HTTP chunks: the reader must wait for the rest, not see a cut message."""
    client.enqueue_one({"q": "big"}, mode="test")
    rollout, attempt = client.dequeue(worker_id="remote", mode="test")
    spans = [llm_span(rollout, attempt, n_prompt=2_000, seed=100 + i) for i in range(40)]
    assert client.add_spans(spans) == 40
    reader = client.spans_reader(attempt_ids=[attempt.attempt_id], columns=["span_id", "prompt_token_ids"],
                                 batch_size=1024)
    table = reader.read_all()
    assert table["span_id"].to_pylist() == [s.span_id for s in spans]
    assert table["prompt_token_ids"].to_pylist() == [s.llm.prompt_token_ids for s in spans]


def test_errors_are_4xx_with_a_message(server: ServerProcess, client: StoreClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    json_header = {**auth, "Content-Type": "application/json"}
    bad_json = httpx.post(f"{server.url}/rollouts", content=b"[{not json", headers=json_header)
    assert bad_json.status_code == 422
    wrong_type = httpx.post(f"{server.url}/dequeue", json={"worker_id": 5, "mode": "nope"}, headers=auth)
    assert wrong_type.status_code == 422 and "mode" in wrong_type.text
    bad_arrow = httpx.post(f"{server.url}/spans/arrow", content=b"garbage", headers=auth)
    assert bad_arrow.status_code == 422 and "Arrow IPC" in bad_arrow.text
    huge = httpx.post(f"{server.url}/spans", content=b"[" + b" " * (2 * 1024 * 1024) + b"]", headers=auth)
    assert huge.status_code == 413
    with pytest.raises(NotFoundError, match="unknown rollout_id"):
        client.get_rollout("ro-nope")
    with pytest.raises(NotFoundError):
        client.heartbeat("at-nope")
    client.enqueue_one({})
    rollout, attempt = client.dequeue()
    ghost = llm_span(rollout, attempt).model_copy(update={"attempt_id": "at-ghost"})
    with pytest.raises(InvalidSpanError, match="unknown attempt_id 'at-ghost'"):
        client.add_spans([ghost])
    with pytest.raises(QueryError, match="only SELECT"):
        client.query("DELETE FROM spans")
    with pytest.raises(QueryError, match="no access to files"):
        client.query("SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(QueryError, match="only SELECT"):
        client.query("ATTACH '/tmp/other.duckdb' AS o")
    # values JSON cannot hold are sent as strings, not a 500
    odd = client.query("SELECT 'inf'::DOUBLE AS a, '-inf'::DOUBLE AS b, 'nan'::DOUBLE AS c").to_pylist()
    assert odd == [{"a": "Infinity", "b": "-Infinity", "c": "NaN"}]


def test_sql_takes_query_or_sql_and_a_422_names_query(server: ServerProcess) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for key in ("query", "sql"):
        resp = httpx.post(f"{server.url}/sql", json={key: "SELECT 41 + 1 AS n"}, headers=auth)
        assert resp.status_code == 200 and resp.json() == [{"n": 42}], (key, resp.text)
    for body in ({}, {"q": "SELECT 1"}):
        resp = httpx.post(f"{server.url}/sql", json=body, headers=auth)
        assert resp.status_code == 422 and ["body", "query"] in [e["loc"] for e in resp.json()["detail"]], resp.text


def test_openapi_is_served(server: ServerProcess) -> None:
    spec = httpx.get(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert {"/dequeue", "/spans", "/spans/arrow", "/sql"} <= set(spec["paths"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
routes = st.sampled_from([
    ("POST", "/rollouts"), ("POST", "/dequeue"), ("POST", "/attempts/{id}/heartbeat"),
    ("POST", "/attempts/{id}/finish"), ("POST", "/rollouts/{id}/cancel"), ("POST", "/spans"),
    ("POST", "/resources"), ("POST", "/sql"), ("GET", "/rollouts/{id}"), ("GET", "/resources/{id}"),
    ("GET", "/attempts/{id}"),
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=routes, body=json_values, ident=st.text(min_size=1, max_size=12))
def test_fuzzed_requests_never_get_a_5xx(server: ServerProcess, route, body, ident) -> None:
    method, path = route
    url = server.url + path.replace("{id}", quote(ident, safe=""))
    resp = httpx.request(method, url, json=body if method == "POST" else None,
                         headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert resp.status_code < 500, (method, path, body, resp.text)


def test_sigkilled_server_loses_no_acknowledged_span(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "kill.duckdb", free_port())
    srv.start()
    client = StoreClient(srv.url, token=TOKEN, retry_for_s=60)
    client.enqueue_one({})
    rollout, attempt = client.dequeue()
    acked: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set():
                batch = [llm_span(rollout, attempt, seed=i + j, span_id=f"k{i + j}") for j in range(20)]
                client.add_spans(batch)  # retried across the restart; the server dedupes repeats
                acked.extend(s.span_id for s in batch)
                i += 20
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(1.5)
    srv.stop(signal.SIGKILL)
    before_restart = len(acked)
    srv.start()
    time.sleep(1.0)
    stop.set()
    thread.join(timeout=60)
    assert not errors, errors
    assert before_restart > 0 and len(acked) > before_restart  # it wrote before the kill and after the restart
    ids = client.spans_table(columns=["span_id"])["span_id"].to_pylist()
    assert set(acked) <= set(ids), f"{len(set(acked) - set(ids))} acknowledged spans lost"
    assert len(ids) == len(set(ids)), "a span was stored twice"
    client.close()
    srv.stop()


def test_a_chunked_body_over_the_limit_is_413(server: ServerProcess) -> None:
    """No Content-Length (chunked transfer): the bytes are counted as they arrive."""
    def body() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * 65_536  # 2.5 MB against the fixture's 1 MB limit

    for path in ("/spans/arrow", "/spans"):
        resp = httpx.post(server.url + path, content=body(), timeout=30,
                          headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        assert resp.status_code == 413, (path, resp.status_code, resp.text)


def test_reading_spans_does_not_stall_other_requests(tmp_path: Path) -> None:
    """GET /spans/arrow runs its store call in a thread, like every route: other requests go on meanwhile."""
    from spanlab.store import SpanStore
    from spanlab.store.server import create_store_app
    from spanlab.threaded_server import ThreadedServer

    class SlowReads(SpanStore):
        def spans_reader(self, **kw):  # type: ignore[no-untyped-def, override]
            time.sleep(2.0)  # a stalled /health would wait ~1.8 s: far from the bound below, even on a loaded machine
            return super().spans_reader(**kw)

    with SlowReads(tmp_path / "slow.duckdb") as store:
        server = ThreadedServer(create_store_app(store), name="store").start()
        try:
            reader = threading.Thread(target=lambda: httpx.get(server.url + "/spans/arrow", timeout=30))
            reader.start()
            time.sleep(0.2)
            t0 = time.monotonic()
            assert httpx.get(server.url + "/health", timeout=30).is_success
            waited = time.monotonic() - t0
            reader.join()
        finally:
            server.stop()
    assert waited < 1.0, f"/health waited {waited:.2f}s behind a span read"
