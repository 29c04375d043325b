"""Running model-written SQL: extraction, read-only guards, timeouts, and the execution-match reward."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

import pytest

from spanlab.agents.sql.databases import db_path
from spanlab.agents.sql.execution import ExecResult, connect_readonly, execution_match, extract_sql, run_sql, same_rows


@pytest.fixture
def company(tmp_path: Path) -> Path:
    """A private copy of the company database, so a write that got through would show."""
    return db_path("company", root=tmp_path)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("text", "sql"),
    [
        ("```sql\nSELECT name FROM employees;\n```\nThis lists names.", "SELECT name FROM employees"),
        ("Here:\n```sqlite\nselect name\nfrom employees\n```", "select name\nfrom employees"),
        ("```sql\nSELECT name FROM t WHERE title = 'Clerk'", "SELECT name FROM t WHERE title = 'Clerk'"),
        ("SELECT a FROM t WHERE b = 'x;y'; DROP TABLE t", "SELECT a FROM t WHERE b = 'x;y'"),
        ("SELECT 1\n\nThis query returns one.", "SELECT 1"),
        ("To count them, select the rows:\nSELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t"),
        ("WITH c AS (SELECT 1 AS x) SELECT x FROM c;", "WITH c AS (SELECT 1 AS x) SELECT x FROM c"),
        ("```\nno query here\n```\nSELECT 2", "SELECT 2"),
        ("with a composite key the table is fine", None),
        ("DROP TABLE employees;", None),
        ("Quinn Okafor was hired in 2022.", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_sql(text: str | None, sql: str | None) -> None:
    assert extract_sql(text) == sql


def test_reads_work_and_report_columns(company: Path) -> None:
    result = run_sql(company, "SELECT name, salary FROM employees ORDER BY salary DESC LIMIT 2")
    assert result.ok and result.columns == ["name", "salary"] and len(result.rows) == 2
    assert run_sql("company", "SELECT COUNT(*) FROM employees").rows == [(36,)]


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("INSERT INTO departments VALUES (9, 'X', 'Y', 1)", "only a single SELECT"),
        ("DROP TABLE employees", "only a single SELECT"),
        ("ATTACH DATABASE 'other.db' AS other", "only a single SELECT"),
        ("PRAGMA writable_schema = 1", "only a single SELECT"),
        ("SELECT 1; DROP TABLE employees", "only one statement"),
        ("SELECT 1; SELECT 2", "only one statement"),
        ("WITH x AS (SELECT 1) DELETE FROM employees", "not allowed"),
        ("WITH x AS (SELECT 1) INSERT INTO departments VALUES (9, 'X', 'Y', 1)", "not allowed"),
        ("SELECT * FROM pragma_table_info('employees')", "not allowed"),
    ],
)
def test_writes_and_multiple_statements_are_rejected(company: Path, sql: str, error: str) -> None:
    before = _digest(company)
    result = run_sql(company, sql)
    assert not result.ok and error in (result.error or "") and result.rows == []
    assert _digest(company) == before
    assert run_sql(company, "SELECT COUNT(*) FROM employees").rows == [(36,)]
    assert run_sql(company, "SELECT COUNT(*) FROM departments").rows == [(6,)]


def test_the_connection_itself_refuses_writes_and_attach(company: Path, tmp_path: Path) -> None:
    """The guards behind the statement check: the authorizer and the read-only file mode."""
    before = _digest(company)
    conn = connect_readonly(company)
    try:
        for sql in ("DELETE FROM employees", "CREATE TABLE t (x)", f"ATTACH DATABASE '{tmp_path / 'x.db'}' AS x",
                    "PRAGMA query_only = 0", "UPDATE employees SET salary = 0"):  # fmt: skip
            with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
                conn.execute(sql)
    finally:
        conn.close()
    assert not (tmp_path / "x.db").exists() and _digest(company) == before
    plain = sqlite3.connect(f"{company.as_uri()}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        plain.execute("DELETE FROM employees")
    plain.close()


def test_a_runaway_query_times_out(company: Path) -> None:
    started = time.monotonic()
    result = run_sql(company, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT MAX(x) FROM c",
                     timeout_s=0.3)  # fmt: skip
    assert result.error == "timed out after 0.3 s"
    assert time.monotonic() - started < 3.0
    assert run_sql(company, "SELECT 1").rows == [(1,)], "the database still answers"


def test_rows_are_capped(company: Path) -> None:
    result = run_sql(company, "SELECT a.id, b.id FROM employees a, employees b", max_rows=10)
    assert result.ok and result.truncated and len(result.rows) == 10
    assert "more than 10 rows" in result.preview(3)


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("SELECT nme FROM employees", "no such column: nme"),
        ("SELECT name FROM staff", "no such table: staff"),
        ("SELECT name FROM employees WHERE", "syntax error"),
    ],
)
def test_errors_are_clear(company: Path, sql: str, error: str) -> None:
    result = run_sql(company, sql)
    assert not result.ok and error in (result.error or "")
    assert result.preview().startswith("Error: ") and error in result.preview()


def test_preview() -> None:
    assert ExecResult("q", rows=[("a", 1.5), ("b", None)]).preview() == "a, 1.5\nb, NULL"
    assert ExecResult("q").preview() == "No rows."
    assert ExecResult("q", rows=[(i,) for i in range(7)]).preview(2) == "0\n1\n... (7 rows)"


def test_match_ignores_order_unless_the_gold_sorts(company: Path) -> None:
    gold = "SELECT name FROM employees WHERE title = 'Clerk'"
    assert execution_match(company, gold, gold)
    assert execution_match(company, "SELECT name FROM employees WHERE title = 'Clerk' ORDER BY name DESC", gold)
    assert execution_match(company, "select e.name AS who from employees e where e.title = 'Clerk'", gold)
    assert not execution_match(company, "SELECT name, title FROM employees WHERE title = 'Clerk'", gold)
    assert not execution_match(company, "SELECT name FROM employees", gold)
    top = "SELECT name FROM employees ORDER BY salary DESC LIMIT 3"
    assert execution_match(company, "SELECT name FROM employees ORDER BY salary DESC LIMIT 3", top)
    reversed_ = "SELECT name FROM (SELECT name, salary FROM employees ORDER BY salary DESC LIMIT 3) ORDER BY salary"
    assert not execution_match(company, reversed_, top)


def test_match_counts_duplicates_and_compares_numbers_with_tolerance(company: Path) -> None:
    gold = "SELECT AVG(salary) FROM employees"
    assert execution_match(company, "SELECT SUM(salary) * 1.0 / COUNT(*) FROM employees", gold)
    assert not execution_match(company, "SELECT ROUND(AVG(salary) / 1000) FROM employees", gold)
    assert execution_match(company, "SELECT 36.0", "SELECT COUNT(*) FROM employees")
    titles = "SELECT DISTINCT title FROM employees"
    assert not execution_match(company, "SELECT title FROM employees", titles), "a multiset, not a set"
    assert same_rows([(1.0000000001, "a")], [(1, "a")], ordered=True)
    assert not same_rows([(1.01, "a")], [(1, "a")], ordered=True)
    assert not same_rows([("1",)], [(1,)], ordered=False), "text is not a number"
    assert same_rows([(None, 2), (1, "x")], [(1, "x"), (None, 2.0)], ordered=False)


def test_match_fails_cleanly_on_bad_predictions_and_loudly_on_a_bad_gold(company: Path) -> None:
    gold = "SELECT name FROM employees WHERE title = 'Clerk'"
    for predicted in (None, "", "SELECT nme FROM employees", "DROP TABLE employees", "SELECT 1; SELECT 2"):
        assert not execution_match(company, predicted, gold)
    assert not execution_match(company, "SELECT a.name FROM employees a, employees b, employees c", gold)
    with pytest.raises(ValueError, match="gold query failed"):
        execution_match(company, gold, "SELECT nme FROM employees")
