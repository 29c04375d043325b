"""The README's and docs' code runs as written: every ``python`` block in a fresh interpreter, every ``sql`` block
on a store that has the tables and views it names.

A Python block that cannot run here (it starts an engine, or is a fragment of a larger program) says so on the
line above its fence, ``<!-- not run: why, and what covers it -->``; every other block runs. Python blocks run in
a temporary folder (relative paths such as ``runs/spans.duckdb`` land there) with ``SPANLAB_STORE_URL`` and
``SPANLAB_STORE_TOKEN`` naming a real store server, which is how a snippet reaches one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spanlab.demo import run_demo
from spanlab.store import SpanStore
from tests.stores import TOKEN, ServerProcess

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


@dataclass(frozen=True)
class Snippet:
    where: str  # file:line of the fence
    lang: str
    code: str
    not_run: str | None  # why not, when the block says so

    def __str__(self) -> str:
        return self.where


def snippets(lang: str) -> list[Snippet]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) != lang:
                continue
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            reason = NOT_RUN.search(before)
            found.append(Snippet(f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}", lang,
                                 m.group(2), reason.group(1) if reason else None))
    return found


PYTHON = snippets("python")
SQL = snippets("sql")


def test_the_docs_have_snippets_and_every_skip_says_why() -> None:
    assert len(PYTHON) >= 5 and len(SQL) >= 2
    ran = [s for s in PYTHON if s.not_run is None]
    assert len(ran) >= 4, [str(s) for s in ran]
    assert any("StoreClient" in s.code for s in ran) and any("OTLPSpanExporter" in s.code for s in ran)


@pytest.fixture(scope="module")
def store_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("snippets") / "served.duckdb").start()
    yield server
    server.stop()


@pytest.mark.parametrize("snippet", [s for s in PYTHON if s.not_run is None], ids=str)
def test_a_python_snippet_runs_as_written(snippet: Snippet, tmp_path: Path, store_server: ServerProcess) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPANLAB_STORE_URL": store_server.url,
           "SPANLAB_STORE_TOKEN": TOKEN}
    env.pop("SPANLAB_DB", None)
    out = subprocess.run([sys.executable, "-c", snippet.code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"{snippet} failed:\n{out.stderr[-3000:]}"


def test_the_otel_snippet_stores_its_span_on_the_attempt(tmp_path: Path, store_server: ServerProcess) -> None:
    (otel,) = [s for s in PYTHON if "OTLPSpanExporter" in s.code]
    with store_server.client() as client:
        before = client.query("SELECT count(*) AS n FROM llm_calls WHERE attempt_id IS NOT NULL").to_pylist()
        test_a_python_snippet_runs_as_written(otel, tmp_path, store_server)
        after = client.query("SELECT count(*) AS n FROM llm_calls WHERE attempt_id IS NOT NULL").to_pylist()
    assert after[0]["n"] == before[0]["n"] + 1


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpanStore]:
    db = tmp_path_factory.mktemp("sql") / "demo.duckdb"
    run_demo(db, n_rollouts=12, seed=0)
    with SpanStore(db) as store:
        yield store


@pytest.mark.parametrize("snippet", SQL, ids=str)
def test_an_sql_snippet_runs_on_a_store(snippet: Snippet, demo_store: SpanStore) -> None:
    code = "\n".join(line for line in snippet.code.splitlines() if not line.lstrip().startswith("--"))
    statements = [s.strip() for s in code.split(";") if s.strip()]
    assert statements, snippet
    for statement in statements:
        demo_store.query(statement)  # a QueryError names the statement's problem
