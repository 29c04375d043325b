"""`spanlab sql` and `spanlab demo`: formats, defaults, refusals.

Most cases call the CLI's app in-process (typer's runner: the same parsing, exit codes, stdout and stderr as the
console command, without 1-3 s of imports per call on 2 cores). Two run the real console command in a
subprocess, where the process boundary is the point: ``--help`` of the installed command, and the default
database read from the process's own environment and working directory.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanlab.cli import app

SPANLAB = str(Path(sys.executable).with_name("spanlab"))


def spanlab_process(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None
                    ) -> subprocess.CompletedProcess:
    """The installed console command in a subprocess."""
    base = {k: v for k, v in os.environ.items() if k != "SPANLAB_DB"}
    full_env = {**base, "COLUMNS": "200", **(env or {})}
    return subprocess.run([SPANLAB, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=120)


def spanlab(*args: str) -> subprocess.CompletedProcess:
    """The CLI's app in this process: exit code, stdout and stderr apart, ``SPANLAB_DB`` unset, 200 columns."""
    result = CliRunner().invoke(app, list(args), env={"SPANLAB_DB": None, "COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    out = spanlab("demo", "--db", str(db), "--rollouts", "30", "--seed", "3")
    assert out.returncode == 0, out.stderr
    assert "wrote 30 rollouts" in out.stdout
    return db


def test_help_lists_subcommands() -> None:
    out = spanlab_process("--help")
    assert out.returncode == 0
    for cmd in ("sql", "demo"):
        assert cmd in out.stdout


def test_json_and_csv_output(demo_db: Path) -> None:
    q = "SELECT rollout_id, status, attempts, llm_calls FROM rollout_summary ORDER BY rollout_id"
    as_json = json.loads(spanlab("sql", q, "--db", str(demo_db), "--format", "json").stdout)
    assert len(as_json) == 30
    assert all(r["status"] in ("succeeded", "failed") for r in as_json)
    assert sum(r["attempts"] for r in as_json) > 30  # the demo's crashing attempts were retried
    as_csv = list(csv.DictReader(io.StringIO(spanlab("sql", q, "--db", str(demo_db), "-f", "csv").stdout)))
    assert [r["rollout_id"] for r in as_csv] == [r["rollout_id"] for r in as_json]


def test_token_ids_come_back_as_lists(demo_db: Path) -> None:
    q = "SELECT prompt_len, prompt_token_ids FROM llm_calls LIMIT 3"
    rows = json.loads(spanlab("sql", q, "--db", str(demo_db), "-f", "json").stdout)
    assert all(len(r["prompt_token_ids"]) == r["prompt_len"] for r in rows)
    assert all(isinstance(t, int) for r in rows for t in r["prompt_token_ids"])


def test_table_output_and_row_cap(demo_db: Path) -> None:
    out = spanlab("sql", "SELECT span_id, kind FROM spans", "--db", str(demo_db), "--max-rows", "5")
    assert out.returncode == 0, out.stderr
    assert "5 rows (more rows" in out.stdout


def test_default_db_from_env_and_cwd(demo_db: Path, tmp_path: Path) -> None:
    via_env = spanlab_process("sql", "SELECT count(*) AS n FROM rollouts", "-f", "json",
                              env={"SPANLAB_DB": str(demo_db)})
    assert json.loads(via_env.stdout) == [{"n": 30}]
    (tmp_path / "spanlab.duckdb").write_bytes(demo_db.read_bytes())
    via_cwd = spanlab_process("sql", "SELECT count(*) AS n FROM rollouts", "-f", "json", cwd=tmp_path)
    assert json.loads(via_cwd.stdout) == [{"n": 30}], via_cwd.stderr


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT * FROM read_csv('/etc/passwd')", "cannot touch files"),
        ("SELECT * FROM read_text('/etc/hostname')", "cannot touch files"),
        ("COPY spans TO '/tmp/spanlab-leak.csv'", "only SELECT"),
        ("ATTACH '/tmp/spanlab-other.duckdb' AS other", "only SELECT"),
        ("INSTALL httpfs", "only SELECT"),
        ("LOAD httpfs", "only SELECT"),
        ("INSERT INTO rollouts (rollout_id) VALUES ('x')", "only SELECT"),
        ("DELETE FROM spans", "only SELECT"),
        ("DROP VIEW llm_calls", "only SELECT"),
        ("SET enable_external_access = true", "only SELECT"),
    ],
)
def test_forbidden_statements_fail_clearly_and_change_nothing(demo_db: Path, query: str, reason: str) -> None:
    before = demo_db.read_bytes()
    out = spanlab("sql", query, "--db", str(demo_db))
    assert out.returncode == 2
    assert "error:" in out.stderr and reason in out.stderr.replace("\n", " ")
    assert not Path("/tmp/spanlab-leak.csv").exists()
    assert demo_db.read_bytes() == before


def test_bad_sql_and_missing_db(demo_db: Path, tmp_path: Path) -> None:
    out = spanlab("sql", "SELEC nonsense", "--db", str(demo_db))
    assert out.returncode == 2 and "syntax error" in out.stderr.lower()
    out = spanlab("sql", "SELECT 1", "--db", str(tmp_path / "nope.duckdb"))
    assert out.returncode == 2 and "does not exist" in out.stderr
    assert not (tmp_path / "nope.duckdb").exists()


def test_time_and_size_limits(demo_db: Path) -> None:
    never_ends = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
    out = spanlab("sql", never_ends, "--db", str(demo_db), "--timeout-s", "1")
    assert out.returncode == 2 and "ran over 1 s" in out.stderr
    out = spanlab("sql", "SELECT repeat('x', 3000000) AS s FROM range(10)", "--db", str(demo_db), "--max-mb", "2",
                  "-f", "csv")
    assert out.returncode == 2 and "MB limit" in out.stderr.replace("\n", " ")


def _sql_at(width: int, *args: str) -> str:
    result = CliRunner().invoke(app, ["sql", *args], env={"SPANLAB_DB": None, "COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_wide_result_prints_one_block_per_record(demo_db: Path) -> None:
    """The query `spanlab demo` suggests has 19 columns: at 160 they do not fit, so each record is a block of
    name/value lines, every value whole (no "…"); a narrow result stays a grid."""
    wide = _sql_at(160, "SELECT * FROM rollout_summary ORDER BY rollout_id LIMIT 5", "--db", str(demo_db))
    first = json.loads(spanlab("sql", "SELECT * FROM rollout_summary ORDER BY rollout_id LIMIT 1", "--db",
                               str(demo_db), "-f", "json").stdout)[0]
    assert [line.split()[:2] for line in wide.splitlines() if line.startswith("record ")] == [
        ["record", str(i)] for i in range(1, 6)]
    block = wide.split("record 2")[0].splitlines()[1:]
    assert [line.split()[0] for line in block] == list(first)  # every column, in order, one line each
    assert f"rollout_id         {first['rollout_id']}" in wide and f"{first['last_attempt_id']}" in wide
    assert "…" not in wide and "5 rows, one block per record: 19 columns do not fit 160" in wide
    narrow = _sql_at(160, "SELECT rollout_id, status FROM rollout_summary LIMIT 2", "--db", str(demo_db))
    assert "record 1" not in narrow and "┃ rollout_id" in narrow and narrow.rstrip().endswith("2 rows")


def test_an_empty_result_prints_the_same_from_a_file_and_from_a_server(demo_db: Path, tmp_path: Path) -> None:
    from spanlab.store import SpanStore
    from spanlab.store.server import create_store_app
    from spanlab.threaded_server import ThreadedServer

    served = tmp_path / "served.duckdb"
    served.write_bytes(demo_db.read_bytes())
    query = "SELECT rollout_id, status, final_reward FROM rollout_summary WHERE final_reward > 2"
    from_file = {f: _sql_at(160, query, "--db", str(demo_db), *f) for f in ((), ("-f", "csv"), ("-f", "json"))}
    assert from_file[()].strip() == "0 rows (columns: rollout_id, status, final_reward)"
    assert from_file[("-f", "csv")] == "rollout_id,status,final_reward\n"
    with SpanStore(served) as store, ThreadedServer(create_store_app(store), name="store server") as server:
        for args, printed in from_file.items():
            assert _sql_at(160, query, "--url", server.url, *args) == printed, args
