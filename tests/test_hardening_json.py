"""One JSON policy on the store server (issue 42, items 1 and 2), a stored bad record quarantined (item 1), and the
token checked before a body is read (item 3).

The repros: a resource or rollout input nested ~300 deep was stored, then every read of its table answered 500;
NaN, Infinity and a lone surrogate in a body gave 500; a 200 MB chunked body was read before the token was.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest

from spanlab.jsonpolicy import MAX_DEPTH, JSONPolicyError, decode
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.threaded_server import ThreadedServer

DEEP = "[" * 300 + "1" + "]" * 300
DEEP_OBJ = '{"a":' * 300 + "1" + "}" * 300
SURROGATE = '"\\ud800"'


def _deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize("raw", [DEEP, "[" * 100_000 + "]" * 100_000, "[NaN]", "[Infinity]", "[-Infinity]",
                                 "[1e999]", f"[{SURROGATE}]", b'["\xff"]', "[1,]"])
def test_the_policy_refuses_what_breaks_later(raw: str | bytes) -> None:
    with pytest.raises(JSONPolicyError) as err:
        decode(raw)
    assert "\n" not in str(err.value) and str(err.value)


def test_the_policy_accepts_ordinary_json() -> None:
    assert decode("[" * MAX_DEPTH + "1" + "]" * MAX_DEPTH) == _deep(MAX_DEPTH)
    assert decode('["\\ud83d\\ude00", 1e308, 12345678901234567890]') == ["\U0001f600", 1e308, 12345678901234567890]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SpanStore, str]]:
    with SpanStore(tmp_path_factory.mktemp("json") / "s.duckdb") as store, \
            ThreadedServer(create_store_app(store)) as srv:
        yield store, srv.url


# (method, path, raw body): 15 routes and fields that answered 500 (or stored NaN) before the policy
BAD_BODIES = [
    ("POST", "/resources", '{"name":"n","payload":{"a":' + DEEP + "}}"),
    ("POST", "/rollouts", '[{"input":' + DEEP + "}]"),
    ("POST", "/rollouts", '[{"input":1,"metadata":' + DEEP_OBJ + "}]"),
    ("POST", "/rollouts", f'[{{"rollout_id":{SURROGATE}}}]'),
    ("POST", "/spans", '[{"name":"c","kind":"custom","start_time":NaN}]'),
    ("POST", "/spans", '[{"name":"c","kind":"custom","start_time":Infinity}]'),
    ("POST", "/spans", f'[{{"name":{SURROGATE},"kind":"custom"}}]'),
    ("POST", "/spans", '[{"name":"c","kind":"custom","attributes":{"a":' + DEEP + "}}]"),
    ("POST", "/metrics", '{"run_id":"r","algorithm":"a","step":1,"metrics":{"x":NaN}}'),
    ("POST", "/metrics", '{"run_id":"r","algorithm":"a","step":1,"metrics":{"x":-Infinity}}'),
    ("POST", "/metrics", '{"run_id":"r","algorithm":"a","step":1,"metrics":{"x":1e999}}'),
    ("POST", "/dequeue", f'{{"worker_id":{SURROGATE}}}'),
    ("POST", "/rollouts/summaries", '{"metadata":' + DEEP_OBJ + "}"),
    ("POST", "/attempts/at-1/finish", '{"status":"failed","spans":[{"name":"c","kind":"custom","end_time":NaN}]}'),
    ("POST", "/sql", f'{{"query":{SURROGATE}}}'),
    ("POST", "/spans", b'[{"name":"\xff","kind":"custom"}]'),
]


@pytest.mark.parametrize(("method", "path", "raw"), BAD_BODIES)
def test_bad_json_gets_422_and_every_read_keeps_answering(server: tuple[SpanStore, str], method: str, path: str,
                                                          raw: str | bytes) -> None:
    _, url = server
    body = raw.encode() if isinstance(raw, str) else raw
    r = httpx.request(method, url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    for read in ("/resources", "/rollouts", "/metrics", "/resources/n"):
        assert httpx.get(url + read).status_code in (200, 404), read
    assert httpx.post(url + "/rollouts/summaries", json={}).status_code == 200
    assert all(m["value"] is not None for m in httpx.get(url + "/metrics").json())


def test_in_process_writes_refuse_json_no_read_could_answer(tmp_path: Path) -> None:
    with SpanStore(tmp_path / "s.duckdb") as store:
        with pytest.raises(ValueError, match="nested deeper"):
            store.add_resource("n", {"a": _deep(300)})
        with pytest.raises(ValueError, match="nested deeper"):
            store.enqueue_one(_deep(300))
        with pytest.raises(ValueError, match="JSON compliant"):
            store.enqueue_one({"x": float("nan")})
        with pytest.raises(ValueError, match="JSON compliant"):
            store.add_resource("n", {"x": float("inf")})
        assert store.list_resources() == [] and store.list_rollouts() == []


def _legacy_store(db: Path) -> dict[str, str]:
    """A store holding records written before the policy (by hand here): one good of each, one bad of each."""
    with SpanStore(db) as store:
        good = store.enqueue_one({"q": "good"})
        store.add_resource("good", {"a": 1})
        late = store.enqueue_one({"q": "late"})
    bad = json.dumps(_deep(300))
    with duckdb.connect(str(db)) as conn:
        row = conn.execute("SELECT * FROM rollouts WHERE rollout_id = ?", [good.rollout_id]).fetchone()
        cols = [d[0] for d in conn.description]
        values = dict(zip(cols, row, strict=True)) | {"rollout_id": "ro-bad", "input": bad, "enqueue_time": 0.0}
        conn.execute(f"INSERT INTO rollouts ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     list(values.values()))
        conn.execute("INSERT INTO resources VALUES ('bad', 1, 'other', ?, 0.0)", [json.dumps({"a": _deep(300)})])
    Path(f"{db}.hot.sqlite").unlink()  # rebuilt from DuckDB when the store opens
    return {"good": good.rollout_id, "late": late.rollout_id}


def test_a_stored_bad_record_is_quarantined_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "s.duckdb"
    ids = _legacy_store(db)
    caplog.set_level(logging.ERROR, logger="spanlab.store")
    with SpanStore(db) as store, ThreadedServer(create_store_app(store)) as srv, \
            httpx.Client(base_url=srv.url) as c:
        for _ in range(3):
            assert [r["name"] for r in c.get("/resources").json()] == ["good"]
            assert [r["rollout_id"] for r in c.get("/rollouts").json()] == [ids["good"], ids["late"]]
            assert len(c.post("/rollouts/summaries", json={}).json()) == 2
        for path in ("/resources/bad", "/rollouts/ro-bad"):
            r = c.get(path)
            assert r.status_code == 404 and "quarantined" in r.json()["detail"], r.text
        # the bad rollout waits first: dequeue takes it out of the queue (failed) and hands out the next
        r = c.post("/dequeue", json={"worker_id": "w"})
        assert r.status_code == 200 and r.json()["rollout"]["rollout_id"] == ids["good"], r.text
        assert c.post("/dequeue", json={"worker_id": "w"}).json()["rollout"]["rollout_id"] == ids["late"]
        assert c.post("/dequeue", json={"worker_id": "w"}).json() is None
        assert c.post("/sql", json={"query": "SELECT status FROM rollouts WHERE rollout_id = 'ro-bad'"}).json() \
            == [{"status": "failed"}]
    logged = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert sum("'ro-bad'" in m for m in logged if m.startswith("quarantined")) == 1, logged
    assert sum("'bad'" in m for m in logged if m.startswith("quarantined")) == 1, logged
    with SpanStore(db) as store:  # and the file opens again
        assert len(store.list_rollouts()) == 2


def test_the_token_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    """A chunked body that never ends: the 401 must come after the headers, not after the body."""
    with SpanStore(tmp_path / "s.duckdb") as store, ThreadedServer(create_store_app(store, token="t")) as srv, \
            socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(b"POST /spans HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"100000\r\n" + b"[" * 65536)
        assert sock.recv(4096).startswith(b"HTTP/1.1 401")


def test_a_loopback_server_answers_only_loopback_host_names(tmp_path: Path) -> None:
    with SpanStore(tmp_path / "s.duckdb") as store, ThreadedServer(create_store_app(store)) as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        assert httpx.get(srv.url + "/health", headers={"Host": "evil.example"}).status_code == 421
        assert httpx.get(f"http://localhost:{srv.port}/health").status_code == 200


def test_user_sql_has_a_memory_limit(tmp_path: Path) -> None:
    """Issue 42, item 3: this query grew the server from 215 MB to 5 GB before the time limit stopped it."""
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    query = "SELECT length(list_sort(l)) FROM (SELECT list(random()) l FROM range(400000000))"
    with SpanStore(tmp_path / "s.duckdb") as store, ThreadedServer(create_store_app(store)) as srv:
        before = me.memory_info().rss
        r = httpx.post(srv.url + "/sql", json={"query": query}, timeout=60)
        grown = me.memory_info().rss - before
        assert r.status_code == 400 and "Memory" in r.json()["detail"] and "\n" not in r.json()["detail"], r.text
        assert grown < 256 * 2**20, f"grew {grown / 2**20:.0f} MiB"
        assert httpx.post(srv.url + "/sql", json={"query": "SELECT 42 AS x"}).json() == [{"x": 42}]


def test_a_compressed_arrow_bomb_is_refused_before_it_is_unpacked(tmp_path: Path) -> None:
    """Issue 42, item 3: a 61 KB zstd stream of zeros was refused with 422 only after it took +800 MB."""
    psutil = pytest.importorskip("psutil")
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    zeros = pa.table({"prompt_token_ids": pa.array(np.zeros(100_000_000, dtype=np.int32))})  # 400 MB unpacked
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, zeros.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(zeros)
    bomb = sink.getvalue().to_pybytes()
    del zeros, sink
    assert len(bomb) < 1 << 20
    me = psutil.Process()
    with SpanStore(tmp_path / "s.duckdb") as store, ThreadedServer(create_store_app(store)) as srv:
        before = me.memory_info().rss
        r = httpx.post(srv.url + "/spans/arrow", content=bomb,
                       headers={"content-type": "application/vnd.apache.arrow.stream"}, timeout=60)
        grown = me.memory_info().rss - before
    assert r.status_code == 422 and "unpacks to more than" in r.text, r.text
    assert grown < 128 * 2**20, f"grew {grown / 2**20:.0f} MiB"
