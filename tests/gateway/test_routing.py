"""Several engines behind one gateway: attempts pinned by rendezvous hashing, spread, moved off a dead engine.

The engines are two small OpenAI-protocol servers on 127.0.0.1 (stand-ins for routing and health only: each
answers with its own name, so a span's ``attributes.replica`` can be checked against who really answered);
one is stopped midway, the way an engine process dies. The gateway, store and HTTP are real.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spanlab.gateway import GatewayServer
from spanlab.gateway.routing import rendezvous
from spanlab.store import SpanStore
from spanlab.threaded_server import ThreadedServer
from tests.stores import running_attempts


def _engine(name: str) -> Starlette:
    """A chat engine answering with its own ``name`` and exact token IDs (as the gateway asks for them)."""

    async def chat(request: Request) -> Response:
        json.loads(await request.body())
        return JSONResponse({"id": "c", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2],
                             "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [7, 8],
                                          "message": {"role": "assistant", "content": name}}],
                             "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


@pytest.fixture
def engines() -> Iterator[list[ThreadedServer]]:
    servers = [ThreadedServer(_engine(f"e{i}"), name=f"engine-{i}").start() for i in range(2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def _on_each(store: SpanStore, urls: list[str], k: int) -> dict[str, list[tuple[str, str]]]:
    """Open attempts until ``k`` of them hash to each engine (by the gateway's rule); engine -> its attempts."""
    on: dict[str, list[tuple[str, str]]] = {url: [] for url in urls}
    while min(map(len, on.values())) < k:
        (rid, aid), = running_attempts(store, 1)
        on[rendezvous(f"{rid}/{aid}", urls)].append((rid, aid))
    return on


def _answer(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


def _ask(gw: GatewayServer, rid: str, aid: str) -> httpx.Response:
    return httpx.post(gw.base_url(rid, aid) + "/chat/completions", timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_rendezvous_is_stable_spreads_and_moves_only_the_lost_nodes_keys() -> None:
    nodes = ["http://a:1", "http://b:1", "http://c:1"]
    keys = [f"ro-{i}/at-{i}" for i in range(300)]
    picks = {k: rendezvous(k, nodes) for k in keys}
    assert picks == {k: rendezvous(k, list(reversed(nodes))) for k in keys}  # order of the nodes does not matter
    counts = {n: sum(p == n for p in picks.values()) for n in nodes}
    assert all(60 < c < 140 for c in counts.values()), counts
    after = {k: rendezvous(k, nodes[:2]) for k in keys}
    assert all(after[k] == picks[k] for k in keys if picks[k] != nodes[2])  # only c's keys moved
    with pytest.raises(ValueError):
        rendezvous("k", [])


def test_attempts_spread_stay_pinned_and_leave_a_dead_engine(store: SpanStore,
                                                             engines: list[ThreadedServer]) -> None:
    urls = [e.url for e in engines]
    on = _on_each(store, urls, 2)
    with GatewayServer(store, upstream_urls=urls, health_interval_s=0) as gw:
        for i, url in enumerate(urls):  # every attempt answered by the engine its hash names, on every call
            for attempt in on[url]:
                assert [_answer(_ask(gw, *attempt)) for _ in range(2)] == [f"e{i}", f"e{i}"]
        gw.flush()
        spans = list(store.iter_spans(kinds=["llm_call"]))
        assert len(spans) == 2 * sum(map(len, on.values()))
        for span in spans:  # the recorded replica is the engine that answered
            assert (span.rollout_id, span.attempt_id) in on[span.attributes["replica"]]
            assert span.attributes["policy_version"] is None
        moved = store.query("SELECT attempt_id FROM spans WHERE kind = 'llm_call' GROUP BY 1 "
                            "HAVING count(DISTINCT attributes->>'replica') > 1")  # the query of docs/replicas.md
        spread = store.query("SELECT attributes->>'replica' AS replica, count(DISTINCT attempt_id) AS attempts "
                             "FROM spans WHERE kind = 'llm_call' GROUP BY 1 ORDER BY 1").to_pylist()
        assert moved.num_rows == 0
        assert spread == sorted([{"replica": u, "attempts": len(on[u])} for u in urls], key=lambda r: r["replica"])
        gw.set_served_version(urls[0], "policy-v1")
        gw.set_served_version(urls[1] + "/v1", "policy-v1")

        engines[1].stop()  # engine e1 dies
        on_dead, on_live = on[urls[1]][0], on[urls[0]][0]
        first = _ask(gw, *on_dead)
        assert first.status_code == 502 and urls[1] in first.json()["error"]["message"]
        again = _ask(gw, *on_dead)  # now known down: refused without a connect, still naming the engine
        assert again.status_code == 502 and "stopped answering" in again.json()["error"]["message"]
        assert urls[1] in again.json()["error"]["message"]
        assert _answer(_ask(gw, *on_live)) == "e0"
        fresh = _on_each(store, urls, 1)[urls[1]]  # new attempts that would hash to e1 (a retry is one) go to e0
        assert [_answer(_ask(gw, *a)) for a in fresh] == ["e0"] * len(fresh)
        health = httpx.get(gw.url + "/health").json()["upstreams"]
        assert [(u["url"], u["healthy"], u["policy_version"]) for u in health] == [
            (urls[0], True, "policy-v1"), (urls[1], False, "policy-v1")]
        gw.flush()
        errors = [s for s in store.iter_spans(kinds=["llm_call"]) if s.status == "error"]
        assert len(errors) == 2 and {s.attributes["replica"] for s in errors} == {urls[1]}
        ok = [s for s in store.iter_spans(kinds=["llm_call"]) if s.status == "ok" and s.attempt_id == fresh[0][1]]
        assert [(s.attributes["replica"], s.attributes["policy_version"]) for s in ok] == [(urls[0], "policy-v1")]


def test_a_probe_brings_a_restarted_engine_back(store: SpanStore, engines: list[ThreadedServer]) -> None:
    urls = [e.url for e in engines]
    port = engines[1].port
    with GatewayServer(store, upstream_urls=urls, health_interval_s=0, health_failures=2) as gw:
        router = gw.gateway.router
        engines[1].stop()

        def probe() -> None:  # the probe loop's body, run on the gateway's own event loop
            asyncio.run_coroutine_threadsafe(router.probe(), gw.gateway.loop).result(timeout=30)

        probe()
        assert router.clients[1].healthy  # one failed probe is not enough (a busy engine misses one)
        probe()
        assert not router.clients[1].healthy and "/health failed" in (router.clients[1].down_reason or "")
        (to_e1,) = _on_each(store, urls, 1)[urls[1]][:1]
        assert _answer(_ask(gw, *to_e1)) == "e0"  # down: its new attempts go elsewhere
        engines[1] = ThreadedServer(_engine("e1"), port=port, name="engine-1").start()
        probe()
        assert router.clients[1].healthy
        (back,) = _on_each(store, urls, 1)[urls[1]][:1]
        assert _answer(_ask(gw, *back)) == "e1"  # up again: new attempts reach it
        assert _answer(_ask(gw, *to_e1)) == "e0"  # and the attempt started meanwhile stays where it began


def test_with_every_engine_down_a_call_is_still_sent(store: SpanStore, engines: list[ThreadedServer]) -> None:
    """So an engine restarted on its port is found by the next call even without probes."""
    urls = [e.url for e in engines]
    on = _on_each(store, urls, 1)
    with GatewayServer(store, upstream_urls=urls, health_interval_s=0) as gw:
        on_e0, on_e1 = on[urls[0]][0], on[urls[1]][0]
        assert _answer(_ask(gw, *on_e0)) == "e0" and _answer(_ask(gw, *on_e1)) == "e1"
        port = engines[0].port
        for engine in engines:
            engine.stop()
        assert _ask(gw, *on_e0).status_code == 502 and _ask(gw, *on_e1).status_code == 502  # both known down
        assert not any(c.healthy for c in gw.gateway.router.clients)
        engines[0] = ThreadedServer(_engine("e0"), port=port, name="engine-0").start()
        assert _answer(_ask(gw, *on_e0)) == "e0"
        assert gw.gateway.router.clients[0].healthy
