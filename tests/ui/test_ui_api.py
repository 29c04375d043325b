"""The UI's JSON API over real HTTP on a real store file: paging, filters, token view, curves, read-only SQL, locks."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from spanlab.store.file_query import run_query
from spanlab.threaded_server import ThreadedServer
from tests.ui.conftest import UiStore, load_test_tokenizer


@pytest.fixture(scope="module")
def http(ui_server: ThreadedServer) -> httpx.Client:
    with httpx.Client(base_url=ui_server.url, timeout=60) as client:
        yield client


def test_index_and_static_files_are_served(http: httpx.Client) -> None:
    page = http.get("/")
    assert page.status_code == 200 and '<main id="view">' in page.text
    for name in ("app.js", "common.js", "tokens.js", "runs.js", "sql.js", "app.css"):
        assert http.get(f"/static/{name}").status_code == 200, name


def test_rollout_pages_cover_every_rollout_once(http: httpx.Client, ui_store: UiStore) -> None:
    total = sum(ui_store.by_status.values())
    seen: list[str] = []
    for offset in range(0, total + 10, 10):
        page = http.get("/api/rollouts", params={"offset": offset, "limit": 10}).json()
        assert page["total"] == total
        assert len(page["rows"]) == max(0, min(10, total - offset))
        seen += [r["rollout_id"] for r in page["rows"]]
    assert len(seen) == len(set(seen)) == total
    newest = http.get("/api/rollouts", params={"limit": 500}).json()["rows"]
    times = [r["enqueue_time"] for r in newest]
    assert times == sorted(times, reverse=True)
    oldest = http.get("/api/rollouts", params={"limit": 500, "sort": "oldest"}).json()["rows"]
    assert [r["rollout_id"] for r in oldest] == [r["rollout_id"] for r in reversed(newest)]


def test_rollout_rows_match_the_rollout_summary_view(http: httpx.Client, ui_store: UiStore) -> None:
    rows = http.get("/api/rollouts", params={"limit": 500}).json()["rows"]
    want = {r["rollout_id"]: r for r in run_query(ui_store.path, "SELECT * FROM rollout_summary").to_pylist()}
    assert len(rows) == len(want)
    for r in rows:
        w = want[r["rollout_id"]]
        for key in ("status", "mode", "attempts", "llm_calls", "prompt_tokens", "response_tokens", "final_reward",
                    "resources_version", "last_attempt_id"):
            assert r[key] == w[key], (key, r, w)


@pytest.mark.parametrize("key", ["status", "mode", "version"])
def test_filters_by_column(http: httpx.Client, ui_store: UiStore, key: str) -> None:
    counts = {"status": ui_store.by_status, "mode": ui_store.by_mode, "version": ui_store.by_version}[key]
    assert len(counts) >= 2
    facets = http.get("/api/info").json()[key]
    assert sorted(facets) == sorted(k for k in counts if k)
    for value, n in counts.items():
        page = http.get("/api/rollouts", params={key: value, "limit": 500}).json()
        assert page["total"] == n == len(page["rows"]), (key, value)
        field = {"version": "resources_version"}.get(key, key)
        assert all(r[field] == value for r in page["rows"])


def test_reward_and_search_filters(http: httpx.Client, ui_store: UiStore) -> None:
    won = http.get("/api/rollouts", params={"min_reward": 1, "limit": 500}).json()
    assert won["total"] == ui_store.rewarded and all(r["final_reward"] == 1.0 for r in won["rows"])
    lost = http.get("/api/rollouts", params={"max_reward": 0.5, "limit": 500}).json()
    assert all(r["final_reward"] == 0.0 for r in lost["rows"]) and lost["total"] > 0
    found = http.get("/api/rollouts", params={"search": '"q17"'}).json()
    assert found["total"] == 1 and '"q17"' in found["rows"][0]["input"]
    both = http.get("/api/rollouts", params={"min_reward": 1, "mode": "val", "limit": 500}).json()
    assert all(r["mode"] == "val" and r["final_reward"] == 1.0 for r in both["rows"])


def test_rollout_view_lists_spans_in_order(http: httpx.Client, ui_store: UiStore) -> None:
    d = http.get(f"/api/rollouts/{ui_store.first_rollout}").json()
    assert [s["kind"] for s in d["spans"]] == ["llm_call", "tool_call", "llm_call", "reward"]
    assert [s["sequence_id"] for s in d["spans"]] == sorted(s["sequence_id"] for s in d["spans"])
    for s in d["spans"]:
        if s["kind"] == "llm_call":
            assert (s["prompt_len"], s["response_len"]) == ui_store.calls[s["span_id"]]
    page = http.get(f"/api/rollouts/{ui_store.first_rollout}", params={"offset": 1, "limit": 2}).json()
    assert [s["span_id"] for s in page["spans"]] == [s["span_id"] for s in d["spans"][1:3]]
    assert page["spans_total"] == 4
    assert http.get("/api/rollouts/ro-nope").status_code == 404
    assert http.get(f"/api/rollouts/{ui_store.first_rollout}", params={"attempt": "at-nope"}).status_code == 404


def test_call_tokens_prompt_then_sampled(http: httpx.Client, ui_store: UiStore) -> None:
    span_id, (p, r) = next(iter(ui_store.calls.items()))
    d = http.get(f"/api/calls/{span_id}/tokens").json()
    assert d["total"] == len(d["ids"]) == len(d["text"]) == p + r
    assert d["mask"] == [0] * p + [1] * r and d["num_sampled"] == r
    assert d["logprobs"][:p] == [None] * p and d["logprobs"][p:] == [-0.5] * r
    window = http.get(f"/api/calls/{span_id}/tokens", params={"offset": 2, "limit": 3}).json()
    assert window["ids"] == d["ids"][2:5] and window["total"] == p + r
    assert http.get("/api/calls/sp-nope/tokens").status_code == 404


def test_non_canonical_split_is_marked_per_token(http: httpx.Client, ui_store: UiStore) -> None:
    tok = load_test_tokenizer()
    d = http.get(f"/api/calls/{ui_store.drift_span}/tokens").json()
    p, _ = ui_store.calls[ui_store.drift_span]
    assert d["text"][p:] == ["f", "o", "u", "r"]
    assert d["retokenized"][:p] == [None] * p  # the canonical prompt re-encodes to itself
    assert d["retokenized"][p:] == [tok.encode("four", add_special_tokens=False)] * 4
    assert d["num_drift"] == 4
    ok = http.get(f"/api/calls/{ui_store.canonical_span}/tokens").json()
    assert ok["num_drift"] == 0 and "".join(ok["text"]).endswith("The answer is four.")


def test_tito_session_tokens_and_boundaries(http: httpx.Client, ui_store: UiStore) -> None:
    d = http.get(f"/api/sessions/{ui_store.tito_attempt}/tokens").json()
    assert d["total"] == 28 and d["segments"] == 2 and d["segment_starts"] == [0, 20]
    assert d["mask"] == [0] * 8 + [1] * 4 + [0] * 3 + [1] * 5 + [0] * 6 + [1] * 2
    assert d["ids"][:12] == list(range(100, 108)) + list(range(200, 204))
    assert sum(lp is not None for lp in d["logprobs"]) == d["num_sampled"] == 11
    detail = http.get("/api/rollouts", params={"mode": "test"}).json()["rows"][0]
    segs = http.get(f"/api/rollouts/{detail['rollout_id']}").json()["tito_segments"]
    assert [(s["segment"], s["segment_start"], s["num_tokens"]) for s in segs] == [(0, 0, 20), (1, 20, 8)]
    assert http.get("/api/sessions/at-nope/tokens").status_code == 404


def test_runs_and_metric_curves(http: httpx.Client) -> None:
    runs = {r["run_id"]: r for r in http.get("/api/runs").json()}
    assert runs["run-a"]["steps"] == 12 and runs["run-a"]["metrics"] == ["loss", "reward_mean"]
    series = http.get("/api/runs/run-a/metrics", params={"names": "reward_mean,loss"}).json()
    assert series["reward_mean"]["step"] == list(range(12))
    assert math.isclose(series["loss"]["value"][3], 0.25)
    assert http.get("/api/runs/run-b/metrics").json()["loss"]["value"] == ["NaN"]  # strict JSON for a NaN loss


def test_sql_box_reads_and_caps_rows(http: httpx.Client, ui_store: UiStore) -> None:
    res = http.post("/api/sql", json={"query": "SELECT rollout_id, status FROM rollout_summary", "max_rows": 5})
    body = res.json()
    assert res.status_code == 200 and body["columns"] == ["rollout_id", "status"]
    assert len(body["rows"]) == 5 and body["truncated"] is True
    all_rows = http.post("/api/sql", json={"query": "SELECT count(*) AS n FROM rollouts"}).json()
    assert all_rows["rows"] == [{"n": sum(ui_store.by_status.values())}] and all_rows["truncated"] is False


@pytest.mark.parametrize("query", [
    "DELETE FROM rollouts",
    "CREATE TABLE x AS SELECT 1",
    "SELECT * FROM read_csv('/etc/passwd')",
    "COPY rollouts TO '/tmp/spanlab-ui-leak.csv'",
    "ATTACH '/tmp/spanlab-ui-other.duckdb' AS other",
])
def test_sql_box_cannot_write_or_reach_files(http: httpx.Client, ui_store: UiStore, query: str) -> None:
    res = http.post("/api/sql", json={"query": query})
    assert res.status_code == 400 and "not allowed" in res.json()["error"]
    assert run_query(ui_store.path, "SELECT count(*) AS n FROM rollouts").to_pylist()[0]["n"] == \
        sum(ui_store.by_status.values())
    assert not Path("/tmp/spanlab-ui-leak.csv").exists()


def test_writer_lock_is_reported_and_ui_never_blocks_a_writer(ui_server: ThreadedServer, ui_store: UiStore,
                                                               http: httpx.Client) -> None:
    assert http.get("/api/rollouts").status_code == 200  # the UI has read the file: it must not hold it now
    code = textwrap.dedent(f"""
        import sys
        from spanlab.store import SpanStore
        with SpanStore({str(ui_store.path)!r}) as store:
            print("open", flush=True)
            sys.stdin.readline()
    """)
    writer = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "open"
        res = http.get("/api/rollouts")
        assert res.status_code == 423 and res.json()["locked"] is True
        assert "held read-write by another process" in res.json()["error"]
        assert http.post("/api/sql", json={"query": "SELECT 1"}).status_code == 423
    finally:
        writer.communicate("\n", timeout=60)
    assert writer.returncode == 0
    assert http.get("/api/rollouts").status_code == 200  # reads work again once the writer is gone


def test_only_the_bound_host_names_are_answered(ui_store) -> None:
    """DNS rebinding: a page on evil.example whose name resolves to 127.0.0.1 sends `Host: evil.example`."""
    from fastapi.testclient import TestClient

    from spanlab.ui import create_app
    from spanlab.ui.hosts import allowed_hosts

    client = TestClient(create_app(ui_store.path, hosts=allowed_hosts("127.0.0.1")))
    for host in ("127.0.0.1:8600", "localhost:8600", "localhost", "[::1]:8600", "LOCALHOST:1"):
        assert client.get("/api/info", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:8600", "127.0.0.1.evil.example", "", "localhost.:8600"):
        got = client.get("/api/info", headers={"Host": host})
        assert got.status_code == 421 and "unknown Host" in got.text, host
    assert client.post("/api/sql", json={"query": "SELECT 1"}, headers={"Host": "evil.example"}).status_code == 421
    public = allowed_hosts("0.0.0.0", ["spans.lab.internal"])
    assert {"localhost", "127.0.0.1", "spans.lab.internal"} <= public and "0.0.0.0" not in public
    assert allowed_hosts("10.1.2.3") == {"10.1.2.3"}


def test_a_run_id_with_a_slash_has_its_curves(tmp_path: Path) -> None:
    """Issue 42, item 9: such a run left the runs page as a bare "Not Found" banner."""
    from urllib.parse import quote

    from spanlab.store import SpanStore
    from spanlab.ui import create_app

    db = tmp_path / "runs.duckdb"
    with SpanStore(db) as store:
        for step in range(3):
            store.add_metrics("team/grpo run", "grpo", step, {"loss": 1.0 / (step + 1)})
    with ThreadedServer(create_app(db)) as srv, httpx.Client(base_url=srv.url) as client:
        assert [r["run_id"] for r in client.get("/api/runs").json()] == ["team/grpo run"]
        curves = client.get(f"/api/runs/{quote('team/grpo run', safe='')}/metrics", params={"names": "loss"})
        assert curves.status_code == 200, curves.text
        assert len(curves.json()["loss"]["value"]) == 3
