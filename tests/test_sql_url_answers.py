"""Issue 65, item 2: ``spanlab sql --url`` prints whatever a store server answers, NaN and infinities as a file's
query prints them, and anything that is not a store's answer (or an invalid URL) is one line and exit 2.

A real store server (``ThreadedServer`` over a DuckDB file) with a stored ``-inf`` logprob; Python's own
http.server playing a server that is not a store; the real CLI in-process.
"""

from __future__ import annotations

import http.server
import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from spanlab.cli import app
from spanlab.store import SpanStore, StoreClient
from spanlab.store.server import create_store_app
from spanlab.store.wire import SQL_COLUMNS_HEADER
from spanlab.threaded_server import ThreadedServer
from spanlab.types import LLMCall, Span
from tests.local_http import serve_handler
from tests.stores import TOKEN

ENV = {"SPANLAB_STORE_TOKEN": None, "COLUMNS": "200"}
NON_FINITE = ("SELECT 'nan'::DOUBLE AS nan, 'inf'::DOUBLE AS pos, '-inf'::DOUBLE AS neg, "
              "['-inf'::FLOAT, -0.5] AS listed, 1.5 AS plain, 'NaN' AS text")
LOGPROBS = "SELECT response_logprobs FROM spans WHERE kind = 'llm_call'"


def _sql(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sql", *args], env=ENV)
    return result.exit_code, result.output


def _one_line_error(code: int, output: str) -> str:
    assert code == 2 and "Traceback" not in output, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    return lines[0]


def _store_with_a_minus_inf_logprob(path: Path) -> None:
    with SpanStore(path) as store:
        store.enqueue_one({"q": 1})
        got = store.dequeue()
        assert got is not None
        store.add_spans([Span(rollout_id=got[0].rollout_id, attempt_id=got[1].attempt_id, name="chat", kind="llm_call",
                              llm=LLMCall(model="m", prompt_token_ids=[1, 2], response_token_ids=[3, 4],
                                          response_logprobs=[float("-inf"), -0.25]))])


def test_non_finite_floats_print_as_a_file_query_prints_them(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    _store_with_a_minus_inf_logprob(db)
    served: dict[tuple[str, str], str] = {}
    with SpanStore(db) as store, ThreadedServer(create_store_app(store, token=TOKEN), name="store") as server:
        for query in (NON_FINITE, LOGPROBS):
            for fmt in ("table", "csv", "json"):
                code, output = _sql(query, "--url", server.url, "--token", TOKEN, "-f", fmt)
                assert code == 0 and "Traceback" not in output, output
                served[query, fmt] = output
        with StoreClient(server.url, token=TOKEN) as client:  # the API's Arrow answer: -inf a float again
            assert client.query(LOGPROBS)["response_logprobs"].to_pylist() == [[float("-inf"), -0.25]]
            assert client.query(NON_FINITE)["listed"].to_pylist() == [[float("-inf"), -0.5]]
    for (query, fmt), output in served.items():
        assert _sql(query, "--db", str(db), "-f", fmt) == (0, output), (query, fmt)
    assert '"-Infinity"' in served[LOGPROBS, "json"] and "-Infinity" in served[NON_FINITE, "table"]
    assert json.loads(served[NON_FINITE, "json"])[0] == {"nan": "NaN", "pos": "Infinity", "neg": "-Infinity",
                                                         "listed": ["-Infinity", -0.5], "plain": 1.5, "text": "NaN"}


class _NotAStore(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the class's ``body`` and ``headers``: what some other server might say."""

    body = b"[]"
    headers_out: ClassVar[dict[str, str]] = {}

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        for key, value in self.headers_out.items():
            self.send_header(key, value)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _server(body: bytes, headers: dict[str, str]) -> AbstractContextManager[str]:
    return serve_handler(type("Handler", (_NotAStore,), {"body": body, "headers_out": headers}))


NOT_A_STORE = {
    "mixed-type rows": (b'[{"a": 1}, {"a": "x"}]', {}, "column 'a' holding number and text values"),
    "mixed lists and numbers": (b'[{"a": [1]}, {"a": 2}]', {}, "column 'a' holding list and number values"),
    "bad column header": (b'[{"a": 1}]', {SQL_COLUMNS_HEADER: "{not json"}, "a column header that is not a list"),
    "header of numbers": (b"[]", {SQL_COLUMNS_HEADER: "[1, 2]"}, "a column header that is not a list"),
    "rows that are not the columns": (b'[{"a": 1}, {"b": 2}]', {SQL_COLUMNS_HEADER: '["a"]'}, "row 1 of columns"),
    "an object": (b'{"rows": []}', {}, "not rows"),
    "not JSON": (b"<html>hi</html>", {}, "a body that is not JSON"),
}


@pytest.mark.parametrize("case", list(NOT_A_STORE), ids=list(NOT_A_STORE))
def test_an_answer_no_store_gives_is_one_line(case: str) -> None:
    body, headers, reason = NOT_A_STORE[case]
    with _server(body, headers) as url:
        line = _one_line_error(*_sql("SELECT 1", "--url", url))
    assert url in line and reason in line and "is it a spanlab store server?" in line, line


def test_a_plain_json_answer_of_another_server_is_rendered() -> None:
    """Rows a store could have sent (one kind per column, nulls anywhere) print, whoever sent them."""
    with _server(b'[{"a": 1, "b": null}, {"a": null, "b": "x"}]', {}) as url:
        code, output = _sql("SELECT 1", "--url", url, "-f", "csv")
    assert (code, output) == (0, "a,b\n1,\n,x\n")


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://[::1", "ftp://host",
                                 "127.0.0.1:8700"])
def test_an_invalid_url_is_one_line(url: str) -> None:
    line = _one_line_error(*_sql("SELECT 1", "--url", url))
    assert f"store URL {url!r}" in line, line
