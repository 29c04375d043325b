"""The per-role view over real HTTP on a real store file: a run's ``role_summary`` rows (rewards, calls and policy
versions per step and role) and each call's role and policy version in an attempt's span list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from spanlab.store.file_query import run_query
from spanlab.threaded_server import ThreadedServer
from tests.ui.conftest import HOSTILE_VERSION, ROLES_RUN, SINGLE_RUN, RolesStore


@pytest.fixture(scope="module")
def http(roles_server: ThreadedServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=roles_server.url, timeout=60) as client:
        yield client


def _roles(http: httpx.Client, run_id: str) -> list[dict]:
    res = http.get(f"/api/runs/{quote(run_id, safe='')}/roles")
    assert res.status_code == 200, res.text
    return res.json()


def test_a_runs_rows_per_step_role_and_policy(http: httpx.Client) -> None:
    """The numbers of ROLE_STEPS worked out by hand: 5 sampled tokens per call; an intermediate reward is the role's
    whose call came last before it; a turn with none has no intermediate mean."""
    rows = _roles(http, ROLES_RUN)
    got = [(r["step"], r["mode"], r["role"], r["policy"], r["policy_versions"], r["rollouts"], r["llm_calls"],
            r["response_tokens"], r["final_reward_mean"], r["final_rewards"], r["intermediate_reward_mean"],
            r["intermediate_rewards"]) for r in rows]
    assert got == [
        (0, "train", "checker", "lora-b", ["lora-b-v1"], 2, 2, 10, 0.5, 2, None, 0),
        (0, "train", "writer", "lora-a", ["lora-a-v1"], 2, 2, 10, 0.5, 2, pytest.approx(0.25), 2),
        (1, "train", "checker", "lora-b", [HOSTILE_VERSION], 1, 1, 5, 1.0, 1, None, 0),
        (1, "train", "writer", "lora-a", ["lora-a-v2"], 1, 2, 10, 1.0, 1, 1.0, 1),
    ]


def test_the_rows_are_the_role_summary_views(http: httpx.Client, roles_store: RolesStore) -> None:
    """The page and ``spanlab sql`` read one definition: every column shown equals the view's."""
    view = run_query(roles_store.path, f"SELECT * FROM role_summary WHERE run_id = '{ROLES_RUN}' "
                                       "ORDER BY step, role").to_pylist()
    rows = _roles(http, ROLES_RUN)
    assert len(rows) == len(view) == 4
    for row, want in zip(rows, view, strict=True):
        assert row == {k: want[k] for k in row}


def test_a_single_agent_run_has_one_row_without_role_or_policy(http: httpx.Client) -> None:
    rows = _roles(http, SINGLE_RUN)
    assert [(r["role"], r["policy"], r["policy_versions"], r["rollouts"], r["llm_calls"], r["final_reward_mean"])
            for r in rows] == [(None, None, [], 2, 3, 0.5)]
    assert _roles(http, "no-such-run") == []  # a run with metrics only (or none): no rows, not an error


def test_the_span_list_names_each_calls_role_and_policy_version(http: httpx.Client, roles_store: RolesStore) -> None:
    d = http.get(f"/api/rollouts/{roles_store.rollouts[ROLES_RUN][2]}").json()
    assert [(s["kind"], s["role"], s["policy"], s["policy_version"]) for s in d["spans"]] == [
        ("llm_call", "writer", "lora-a", "lora-a-v2"), ("reward", None, None, None),
        ("llm_call", "writer", "lora-a", "lora-a-v2"), ("llm_call", "checker", "lora-b", HOSTILE_VERSION),
        ("reward", None, None, None)]
    single = http.get(f"/api/rollouts/{roles_store.rollouts[SINGLE_RUN][0]}").json()
    assert [(s["role"], s["policy_version"]) for s in single["spans"]] == [(None, None), (None, None)]


def test_a_store_whose_view_predates_policy_versions_still_gives_its_rows(tmp_path: Path) -> None:
    """A store written by an older spanlab keeps its old role_summary until a current one opens it read-write; the
    UI, which only reads, shows its rows with no versions rather than failing."""
    import duckdb

    from spanlab.ui import queries
    from tests.ui.conftest import write_roles_store

    path = write_roles_store(tmp_path / "old.duckdb").path
    with duckdb.connect(str(path)) as conn:  # the view as it was before the column existed
        (sql,) = conn.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'role_summary'").fetchone()
        conn.execute(sql.replace("VIEW role_summary", "VIEW role_summary_now", 1))
        conn.execute("CREATE OR REPLACE VIEW role_summary AS SELECT * EXCLUDE (policy_versions) FROM role_summary_now")
    with duckdb.connect(str(path), read_only=True) as conn:
        rows = queries.run_roles(conn, ROLES_RUN)
    assert [r["role"] for r in rows][:2] == ["checker", "writer"] and all(r["policy_versions"] is None for r in rows)
