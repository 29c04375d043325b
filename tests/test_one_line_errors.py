"""Issue 53, item 5: small failures that printed a traceback, a page of retries or a wrong reason now say what is
wrong in one line, and a compressed span batch may unpack to no more than the server's body limit.

Real servers on loopback (the UI, the gateway, Python's own http.server, a store server), the real CLI in-process.
"""

from __future__ import annotations

import http.server
import socket
import time
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.config import MAX_ALIAS_VALUES, load_yaml
from spanlab.errors import ConfigError
from spanlab.gateway import GatewayServer
from spanlab.store import SpanStore
from spanlab.store.server import create_store_app
from spanlab.store.spans import spans_to_arrow
from spanlab.threaded_server import ThreadedServer
from spanlab.ui.app import create_app as create_ui_app
from tests.conftest import llm_span
from tests.local_http import serve_handler


def _sql(url: str) -> tuple[int, str, float]:
    start = time.monotonic()
    result = CliRunner().invoke(app, ["sql", "SELECT 1", "--url", url],
                                env={"SPANLAB_STORE_TOKEN": None, "COLUMNS": "1000"})
    return result.exit_code, result.output, time.monotonic() - start


def _one_line_error(code: int, output: str) -> str:
    assert code == 2 and "Traceback" not in output and "retrying" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    return lines[0]


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # its default writes each request to stderr
        pass


def _static_file_server() -> AbstractContextManager[str]:
    """Python's own http.server: GET serves files, POST is 501 with an HTML page."""
    return serve_handler(_QuietFiles)


def test_spanlab_sql_on_a_server_that_is_not_a_store_server_says_so_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "ui.duckdb"
    SpanStore(db).close()
    with ThreadedServer(create_ui_app(db)) as ui, SpanStore() as store, \
            GatewayServer(store, "http://127.0.0.1:9") as gateway, _static_file_server() as files:
        for url, reason in [(ui.url, "has no /sql route"),
                            (ui.url + "/api", "answered /sql with {"),  # the UI's own SQL box: an object, not rows
                            (gateway.url, "has no /sql route"),
                            (files, "answered 501")]:
            line = _one_line_error(*_sql(url)[:2])
            assert url in line and reason in line, (url, line)
            assert "is it a spanlab store server?" in line, line


def test_spanlab_sql_to_a_refused_port_fails_at_once() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    code, output, took = _sql(f"http://127.0.0.1:{port}")
    line = _one_line_error(code, output)
    assert f"store server http://127.0.0.1:{port} unreachable" in line and "Connection refused" in line, line
    assert took < 3, took


def test_a_long_config_of_plain_keys_is_no_alias_bomb(tmp_path: Path) -> None:
    """5 MB of plain keys was refused as "an alias bomb?" after 13 s: only what aliases add counts now."""
    path = tmp_path / "big.yaml"
    path.write_text("dataset:\n  kwargs:\n" + "".join(f"    key_{i:07d}: value number {i}\n" for i in range(160_000)))
    assert path.stat().st_size > 5_000_000
    cpu = time.process_time()
    data = load_yaml(path)
    assert len(data["dataset"]["kwargs"]) == 160_000
    assert time.process_time() - cpu < 10


def test_aliases_count_by_what_they_add(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    # An anchor of 1,000 values used 50 times adds 50,000: a lot, still a config.
    path.write_text("base: &b [" + ", ".join(["1"] * 1000) + "]\n" + "".join(f"k{i}: *b\n" for i in range(50)))
    assert len(load_yaml(path)["k49"]) == 1000
    path.write_text("base: &b [" + ", ".join(["1"] * 1000) + "]\n" + "".join(f"k{i}: *b\n" for i in range(101)))
    with pytest.raises(ConfigError, match=f"more than {MAX_ALIAS_VALUES} values beyond its own text once its aliases "
                                          "are expanded"):
        load_yaml(path)


def _zstd(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_zstd_span_batch_may_unpack_to_no_more_than_the_body_limit(tmp_path: Path) -> None:
    """A few KB of zstd that unpack to 8 MB: refused by a server with a 1 MB body limit (before, the cap was a fixed
    256 MB, whatever --max-body-mb said); a real span batch under the limit, compressed, is stored."""
    limit = 1 << 20
    zeros = _zstd(pa.table({"prompt_token_ids": pa.array([0] * (2 << 20), type=pa.int32())}))
    assert len(zeros) < 64 << 10
    headers = {"content-type": "application/vnd.apache.arrow.stream"}
    with SpanStore(tmp_path / "s.duckdb") as store, \
            ThreadedServer(create_store_app(store, max_body_bytes=limit)) as srv:
        refused = httpx.post(srv.url + "/spans/arrow", content=zeros, headers=headers, timeout=60)
        assert refused.status_code == 422 and f"unpacks to more than {limit} bytes" in refused.text, refused.text
        store.enqueue_one({"q": 1})
        got = store.dequeue()
        assert got is not None
        spans = [llm_span(got[0], got[1], seed=i) for i in range(3)]
        ok = httpx.post(srv.url + "/spans/arrow", content=_zstd(spans_to_arrow(spans)), headers=headers, timeout=60)
        assert ok.status_code == 200 and ok.json()["inserted"] == 3, ok.text
        assert {s.span_id for s in store.iter_spans()} == {s.span_id for s in spans}
