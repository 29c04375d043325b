"""The README's and docs' code runs as written: every ``python`` block in a fresh interpreter, every ``sql`` block
on a store that has the tables and views it names, every ``yaml`` block validated as the config it is part of,
and every ``spanlab`` command's subcommand, options and tutorial files checked against the CLI.

A Python block that cannot run here (it starts an engine, or is a fragment of a larger program) says so on the
line above its fence, ``<!-- not run: why, and what covers it -->``; every other block runs. Python blocks run in
a temporary folder (relative paths such as ``runs/spans.duckdb`` land there) with ``SPANLAB_STORE_URL`` and
``SPANLAB_STORE_TOKEN`` naming a real store server, which is how a snippet reaches one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spanlab.demo import run_demo
from spanlab.store import SpanStore
from tests.stores import TOKEN, ServerProcess, wait_until

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]  # the docs site, its tutorials included
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


@pytest.mark.parametrize("snippet", [s for s in PYTHON if s.not_run is None and "OTLPSpanExporter" not in s.code],
                         ids=str)  # the OTLP snippet runs once, in the test below, which also checks what it stored
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

        def count() -> int:
            return client.query("SELECT count(*) AS n FROM llm_calls WHERE attempt_id IS NOT NULL").to_pylist()[0]["n"]

        # /sql reads DuckDB, which the hot store's acknowledged writes reach within the copy interval
        assert wait_until(lambda: count() > before[0]["n"])
        assert count() == before[0]["n"] + 1


@pytest.mark.parametrize("snippet", [s for s in snippets("yaml") if s.not_run is None], ids=str)
def test_a_yaml_snippet_is_a_valid_config(snippet: Snippet) -> None:
    """A block whose first line names serve.yaml or run.yaml is that file; any other is (part of) a train config,
    every section of which is optional."""
    import yaml

    from spanlab.config import RunConfig, parse
    from spanlab.jobs.config import parse_train_config
    from spanlab.serve import ServeConfig

    data = yaml.safe_load(snippet.code)
    first = snippet.code.splitlines()[0]
    if "serve.yaml" in first:
        parse(ServeConfig, data, source=str(snippet))
    elif "run.yaml" in first:
        parse(RunConfig, data, source=str(snippet))
    else:
        parse_train_config(data, str(snippet))


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpanStore]:
    db = tmp_path_factory.mktemp("sql") / "demo.duckdb"
    run_demo(db, n_rollouts=12, seed=0)
    with SpanStore(db) as store:
        yield store


@pytest.mark.parametrize("snippet", [s for s in SQL if s.not_run is None], ids=str)
def test_an_sql_snippet_runs_on_a_store(snippet: Snippet, demo_store: SpanStore) -> None:
    code = "\n".join(line for line in snippet.code.splitlines() if not line.lstrip().startswith("--"))
    statements = [s.strip() for s in code.split(";") if s.strip()]
    assert statements, snippet
    for statement in statements:
        demo_store.query(statement)  # a QueryError names the statement's problem


def _spanlab_lines() -> Iterator[tuple[str, list[str]]]:
    """``(where, words)`` of every ``spanlab ...`` command in a shell block (README, docs, tutorials)."""
    paths = [*DOCS, *sorted((REPO / "tutorials").glob("*/README.md"))]
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) not in ("bash", "sh", ""):
                continue
            for line in m.group(2).replace("\\\n", " ").splitlines():
                lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
                lexer.whitespace_split, lexer.commenters = True, "#"
                try:
                    tokens = list(lexer)
                except ValueError:  # not shell (a diagram, a file's text)
                    continue
                command: list[str] = []
                for token in [*tokens, ";"]:
                    if token in ("&&", "||", ";", "|", "&"):
                        if command and command[0].endswith("spanlab"):
                            yield f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}", command[1:]
                        command = []
                    else:
                        command += [word] if (word := token.strip("[]")) else []  # [--opt VALUE]: optional


def test_spanlab_commands_in_the_docs_use_subcommands_options_and_files_that_exist() -> None:
    import typer

    from spanlab.cli import app

    root = typer.main.get_command(app)
    checked = 0
    for where, words in _spanlab_lines():
        cmd, rest = root, list(words)
        while getattr(cmd, "commands", None) and rest and not rest[0].startswith("-"):
            name = rest.pop(0)
            assert name in cmd.commands, f"{where}: spanlab {' '.join(words)}: no subcommand {name}"
            cmd = cmd.commands[name]
        options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        for word in rest:
            flag = word.split("=", 1)[0]
            if flag.startswith("-") and flag not in ("-", "--") and not flag[1:].isdigit():
                assert flag in options, f"{where}: spanlab {' '.join(words)}: {flag} is not an option of {cmd.name}"
            if re.fullmatch(r"tutorials/[\w/.-]+\.yaml", word):
                assert (REPO / word).is_file(), f"{where}: {word} does not exist"
        checked += 1
    assert checked >= 10


SQL_COMMANDS = [(where, next(w for w in words if re.match(r"(SELECT|WITH|FROM)\b", w, re.I)))
                for where, words in _spanlab_lines() if words[:1] == ["sql"] and any(
                    re.match(r"(SELECT|WITH|FROM)\b", w, re.I) for w in words)]


@pytest.mark.parametrize(("where", "query"), SQL_COMMANDS, ids=[w for w, _ in SQL_COMMANDS])
def test_the_queries_of_spanlab_sql_commands_in_the_docs_run(where: str, query: str, demo_store: SpanStore) -> None:
    demo_store.query(query)
