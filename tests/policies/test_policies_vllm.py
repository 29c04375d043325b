"""Two LoRA policies served at once by the session's real vLLM, each role routed to its own by the gateway.

The session server (tests/engine_fixtures.py) already serves LoRA (two slots, rank 8), so these tests start no
engine of their own; they unload their adapters at the end, as the weight tests do. The adapters come from peft
(:func:`~spanlab.policies.adapters.multi_adapter_model`) on the served SmolLM2-135M. peft starts B at zero, so a
fresh adapter answers exactly as the base does; the tests give each adapter's B random values of their own, so the
policies differ and "answered by its own adapter" can be seen in the logprobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.engine.weights import ReplicaWeightSync
from spanlab.gateway import GatewayServer
from spanlab.gateway.config import GatewayConfig
from spanlab.policies.adapters import adapter_state, multi_adapter_model
from spanlab.policies.config import PoliciesConfig
from spanlab.policies.serving import PolicyAdapters, resource_name
from spanlab.policies.training import policy_optimizers, samples_by_policy, step_each_policy
from spanlab.store import SpanStore
from spanlab.types import reward_span

pytestmark = pytest.mark.vllm

PROMPT = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
POLICIES = PoliciesConfig(roles={"writer": "lora-a", "rewriter": "lora-a", "checker": "lora-b"},
                          lora={"rank": 8, "alpha": 16, "target_modules": ("q_proj", "v_proj")})


def perturb(model: Any, policy: str, *, seed: int, std: float = 0.02) -> None:
    """Random B for ``policy``'s adapter (peft starts it at zero, i.e. the base model's answers)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if f"lora_B.{policy}." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


@dataclass
class Served:
    store: SpanStore
    gateway: GatewayServer
    adapters: PolicyAdapters
    model: Any
    base_url: str  # the engine's /v1
    base_model: str


@pytest.fixture(scope="module")
def served(vllm_server: Any, default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from spanlab.training.policy import load_policy

    tmp = tmp_path_factory.mktemp("policies")
    base, _ = load_policy(default_model_dir)
    model = multi_adapter_model(base, POLICIES)
    perturb(model, "lora-a", seed=1)
    perturb(model, "lora-b", seed=2)
    with SpanStore(tmp / "spans.duckdb") as store, ReplicaWeightSync([vllm_server.root_url]) as sync, \
            GatewayServer(store, config=GatewayConfig(upstream_base_url=vllm_server.root_url,
                                                      policies=POLICIES)) as gateway:
        adapters = PolicyAdapters(sync, store, POLICIES, tmp / "adapters", on_served=gateway.set_policy_version)
        try:
            adapters.push_all(model)
            yield Served(store, gateway, adapters, model, vllm_server.base_url, vllm_server.model)
        finally:
            for policy in POLICIES.names:
                sync.clients[0].unload_lora(policy)


def _greedy(url: str, model: str, headers: dict[str, str] | None = None) -> tuple[list[int], list[float]]:
    resp = httpx.post(f"{url}/completions", timeout=120, headers=headers, json={
        "model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0,
        "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _as_role(served: Served, role: str) -> tuple[list[int], list[float]]:
    """One call of ``role`` through the gateway, attributed to a fresh attempt; the agent asks for the base model."""
    served.store.enqueue_one({"role": role})
    got = served.store.dequeue(worker_id="w")
    assert got is not None
    rollout, attempt = got
    return _greedy(served.gateway.base_url(rollout.rollout_id, attempt.attempt_id, agent=role), served.base_model)


def _close(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    return a[0] == b[0] and all(abs(x - y) < 1e-4 for x, y in zip(a[1], b[1], strict=True))


def _spans_by_role(served: Served) -> dict[str, list[dict[str, Any]]]:
    assert served.gateway.flush()
    out: dict[str, list[dict[str, Any]]] = {}
    for span in sorted(served.store.iter_spans(), key=lambda s: s.start_time):
        if span.kind == "llm_call":
            out.setdefault(span.attributes.get("agent"), []).append({**span.attributes, "model": span.llm.model})
    return out


def test_each_role_is_answered_by_its_own_adapter(served: Served) -> None:
    direct = {name: _greedy(served.base_url, name) for name in (served.base_model, "lora-a", "lora-b")}
    assert not _close(direct["lora-a"], direct["lora-b"])  # the two adapters differ ...
    assert not _close(direct["lora-a"], direct[served.base_model])  # ... and differ from the base
    assert not _close(direct["lora-b"], direct[served.base_model])

    for role, policy in [("writer", "lora-a"), ("rewriter", "lora-a"), ("checker", "lora-b"),
                         ("judge", served.base_model)]:  # judge: no policy of its own, so the base model
        assert _close(_as_role(served, role), direct[policy]), role

    spans = _spans_by_role(served)
    assert [(s["policy"], s["policy_version"], s["model"]) for s in spans["writer"]] == [("lora-a", "lora-a-v1",
                                                                                        "lora-a")]
    assert [(s["policy"], s["policy_version"]) for s in spans["checker"]] == [("lora-b", "lora-b-v1")]
    assert [s["policy"] for s in spans["judge"]] == ["base"]

    stored = {p: served.store.list_resources(resource_name(p)) for p in POLICIES.names}
    assert [(r.version, r.kind, r.payload["roles"]) for r in stored["lora-a"]] == [
        (1, "lora_adapter", ["rewriter", "writer"])]
    assert Path(stored["lora-b"][0].payload["path"], "adapter_model.safetensors").is_file()


def _asking_for(served: Served, role: str | None, model: str) -> tuple[tuple[list[int], list[float]], dict[str, Any]]:
    """One call through the gateway by ``role`` (None: an unattributed call naming no role) that asks for
    ``model``; its greedy answer and its stored span (attributes, plus ``model``: the span's ``llm.model``)."""
    url = served.gateway.base_url()
    if role is not None:
        served.store.enqueue_one({"role": role})
        got = served.store.dequeue(worker_id="w")
        assert got is not None
        url = served.gateway.base_url(got[0].rollout_id, got[1].attempt_id, agent=role)
    resp = httpx.post(f"{url}/completions", timeout=120, json={
        "model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0, "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    (span_id,) = resp.headers["x-spanlab-span-ids"].split(",")
    assert served.gateway.flush()
    (span,) = [s for s in served.store.iter_spans() if s.span_id == span_id]
    assert span.status == "ok"
    return (choice["token_ids"], choice["logprobs"]["token_logprobs"]), {**span.attributes, "model": span.llm.model}


def test_the_model_an_agent_names_never_picks_the_adapter(served: Served) -> None:
    """A role without a policy that asks for another policy's adapter is answered by the base model, and its span
    says so; a role with a policy gets its own whatever it asks for; so does a call naming no role (the base)."""
    direct = {name: _greedy(served.base_url, name) for name in (served.base_model, "lora-a", "lora-b")}
    assert not _close(direct["lora-a"], direct[served.base_model])
    assert not _close(direct["lora-b"], direct[served.base_model])
    assert not _close(direct["lora-a"], direct["lora-b"])

    for role, asked, policy, model in [("judge", "lora-a", "base", served.base_model),
                                       (None, "lora-b", "base", served.base_model),
                                       ("writer", "lora-b", "lora-a", "lora-a"),
                                       ("checker", served.base_model, "lora-b", "lora-b")]:
        answer, span = _asking_for(served, role, asked)
        assert _close(answer, direct[model]), (role, asked)  # what the engine served ...
        assert (span["policy"], span["model"]) == (policy, model), (role, asked)  # ... is what the span says
        assert span["requested_model"] == asked and span["request_params"]["model"] == model
        assert span.get("agent") == role
    _, span = _asking_for(served, "judge", served.base_model)
    assert (span["policy"], span["model"]) == ("base", served.base_model) and "requested_model" not in span


def test_hot_loading_one_policy_changes_its_roles_only(served: Served) -> None:
    before = {role: _as_role(served, role) for role in ("writer", "checker")}
    lora_b = adapter_state(served.model, "lora-b")
    perturb(served.model, "lora-a", seed=3)
    pushed = served.adapters.push(served.model, "lora-a")
    assert pushed.tag == "lora-a-v2" and pushed.timing.total_s < 30

    after = {role: _as_role(served, role) for role in ("writer", "checker")}
    assert not _close(after["writer"], before["writer"])  # the new lora-a answers the writer
    assert _close(after["checker"], before["checker"])  # lora-b, untouched, answers the checker as before
    assert _close(after["writer"], _greedy(served.base_url, "lora-a"))
    assert all(torch.equal(t, lora_b[k]) for k, t in adapter_state(served.model, "lora-b").items())

    spans = _spans_by_role(served)
    assert spans["writer"][-1]["policy_version"] == "lora-a-v2"
    assert spans["checker"][-1]["policy_version"] == "lora-b-v1"
    versions = served.store.list_resources(resource_name("lora-a"))
    assert [r.version for r in versions] == [1, 2]
    assert versions[0].payload["path"] != versions[1].payload["path"]  # v1's folder is kept as it was


def _multi_agent_rollouts(served: Served, tasks: int, group: int) -> list[str]:
    """Attempts in which the writer and then the checker call through the gateway (sampled at temperature 1),
    each rewarded 0 or 1 in turn so that every group has a signal."""
    ids = []
    for n in range(tasks * group):
        served.store.enqueue_one({"task_id": n // group})
        got = served.store.dequeue(worker_id="w")
        assert got is not None
        rollout, attempt = got
        for role in ("writer", "checker"):
            url = served.gateway.base_url(rollout.rollout_id, attempt.attempt_id, agent=role)
            resp = httpx.post(f"{url}/completions", timeout=120, json={
                "model": served.base_model, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": n})
            assert resp.status_code == 200, resp.text
        assert served.gateway.flush()
        served.store.add_span(reward_span(rollout.rollout_id, attempt.attempt_id, float(n % 2)))
        served.store.finish_attempt(attempt.attempt_id, "succeeded")
        ids.append(rollout.rollout_id)
    return ids


def test_a_grpo_step_on_the_checkers_calls_moves_and_hot_loads_its_adapter_only(served: Served) -> None:
    """The loop of one step: the roles' calls recorded by the gateway, read back per policy, one GRPO step of the
    checker's policy, pushed; the writer's adapter stays bit-identical and keeps answering as before."""
    samples = samples_by_policy(served.store, _multi_agent_rollouts(served, tasks=2, group=2), POLICIES,
                                group_key="task_id")
    assert len(samples["lora-a"]) == len(samples["lora-b"]) == 4
    before = {role: _as_role(served, role) for role in ("writer", "checker")}
    lora_a = adapter_state(served.model, "lora-a")
    lora_b = adapter_state(served.model, "lora-b")
    config = GRPOConfig(lr=5e-3)
    optimizers = policy_optimizers(served.model, POLICIES.names, lambda ps: torch.optim.AdamW(ps, lr=config.lr))
    metrics = step_each_policy(served.model, optimizers, {"lora-b": samples["lora-b"]},
                               lambda m, opt, s: grpo_step(m, opt, s, config, pad_id=0))
    assert metrics["lora-b/skipped"] == 0.0 and metrics["lora-b/n_samples_used"] == 4
    assert all(torch.equal(t, lora_a[k]) for k, t in adapter_state(served.model, "lora-a").items())
    assert any(not torch.equal(t, lora_b[k]) for k, t in adapter_state(served.model, "lora-b").items())

    assert served.adapters.push(served.model, "lora-b").tag == "lora-b-v2"
    after = {role: _as_role(served, role) for role in ("writer", "checker")}
    assert _close(after["writer"], before["writer"])
    assert not _close(after["checker"], before["checker"])
    assert _spans_by_role(served)["checker"][-1]["policy_version"] == "lora-b-v2"
