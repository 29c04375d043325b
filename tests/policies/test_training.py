"""One GRPO step per policy: each adapter moves on its own roles' samples only; the rest stays bit-identical.

A tiny random Llama with two peft adapters (``lora-a`` for the writer, ``lora-b`` for the checker), and multi-agent
attempts recorded in a real store as the gateway records them (each call with ``attributes.agent``, one final
reward per rollout). The samples are read back per policy with the sample reader and stepped with ``grpo_step``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from spanlab.adapters.credit import CreditConfig
from spanlab.adapters.sample_reader import iter_samples
from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.policies.adapters import multi_adapter_model
from spanlab.policies.config import PoliciesConfig
from spanlab.policies.training import policy_optimizers, policy_parameters, samples_by_policy, step_each_policy
from spanlab.store import SpanStore
from spanlab.types import LLMCall, Rollout, RolloutConfig, Span, reward_span
from tests.conftest import scripted_spans

POLICIES = PoliciesConfig(roles={"writer": "lora-a", "checker": "lora-b"},
                          lora={"rank": 4, "alpha": 8, "target_modules": ("q_proj", "v_proj")})
CONFIG = GRPOConfig(lr=1e-2)
VOCAB, TASKS, GROUP = 16, 2, 4


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0)
    return multi_adapter_model(LlamaForCausalLM(config), POLICIES)


def _record(store: SpanStore, *, same_writer: bool = False) -> list[str]:
    """TASKS x GROUP rollouts; each attempt has a writer call and a checker call, and a reward of its own.

    ``same_writer``: the writer's call is the same in every rollout of a task (its output did not vary; the
    checker's did, and so did the rewards)."""
    rng = np.random.default_rng(0)
    writer_calls = {task: (rng.integers(1, VOCAB, 5).tolist(), rng.integers(1, VOCAB, 4).tolist())
                    for task in range(TASKS)} if same_writer else {}
    rollouts = store.enqueue([Rollout(input={"task_id": n // GROUP}) for n in range(TASKS * GROUP)])
    for n, rollout in enumerate(rollouts):
        got = store.dequeue(worker_id="w")
        assert got is not None
        attempt = got[1].attempt_id
        calls = {role: (rng.integers(1, VOCAB, 5).tolist(), rng.integers(1, VOCAB, 4).tolist())
                 for role in ("writer", "checker")}
        if same_writer:
            calls["writer"] = writer_calls[n // GROUP]
        spans = [Span(rollout_id=rollout.rollout_id, attempt_id=attempt, name="chat", kind="llm_call",
                      attributes={"agent": role},
                      llm=LLMCall(model="tiny", prompt_token_ids=prompt, response_token_ids=response,
                                  response_logprobs=[-2.5] * 4))
                 for role, (prompt, response) in calls.items()]
        store.add_spans([*spans, reward_span(rollout.rollout_id, attempt, float(n % GROUP) / GROUP)])
        store.finish_attempt(attempt, "succeeded")
    return [r.rollout_id for r in rollouts]


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, samples: list) -> dict[str, float]:
    return grpo_step(model, optimizer, samples, CONFIG, pad_id=0)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.fixture
def samples() -> dict[str, list]:
    with SpanStore(":memory:") as store:
        return samples_by_policy(store, _record(store), POLICIES, group_key="task_id")


def test_each_policy_gets_the_calls_of_its_roles(samples: dict[str, list]) -> None:
    assert {p: len(s) for p, s in samples.items()} == {"lora-a": TASKS * GROUP, "lora-b": TASKS * GROUP}
    assert {tuple(s.input_ids) for s in samples["lora-a"]}.isdisjoint(tuple(s.input_ids) for s in samples["lora-b"])


def test_the_default_policy_gets_the_calls_of_the_roles_the_map_leaves_out() -> None:
    """``default: lora-b`` with only the writer mapped: the checker's calls go to lora-b (the gateway routes them
    there), so lora-b trains on them; ``agents`` still limits every policy to the trained roles."""
    only_writer = POLICIES.model_copy(update={"roles": {"writer": "lora-a"}, "default": "lora-b"})
    with SpanStore(":memory:") as store:
        ids = _record(store)
        by_role = samples_by_policy(store, ids, POLICIES, group_key="task_id")
        by_default = samples_by_policy(store, ids, only_writer, group_key="task_id")
        writer_only = samples_by_policy(store, ids, only_writer, group_key="task_id", agents=["writer"])
    assert [s.input_ids.tolist() for s in by_default["lora-b"]] == [s.input_ids.tolist() for s in by_role["lora-b"]]
    assert len(by_default["lora-a"]) == TASKS * GROUP
    assert set(writer_only) == {"lora-a"}  # the checker is not trained: the default has no roles left


class CountingStore(SpanStore):
    """A real store that counts the adapter's passes over it (each ``iter_samples`` starts with ``last_attempts``)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads = 0

    def last_attempts(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().last_attempts(*args, **kwargs)


@pytest.mark.parametrize("credit", [None, CreditConfig(mode="per_turn", discount=0.5)])
@pytest.mark.parametrize("agents", [None, ["writer", "checker", ""]])
def test_one_read_gives_each_policy_what_reading_its_own_roles_gives(credit: CreditConfig | None,
                                                                      agents: list[str] | None) -> None:
    """Three roles on two policies plus calls naming no role (the default's): one pass over the store, and each
    policy's samples equal, in order and reward, to a read of its roles alone (how each policy was read before)."""
    policies = PoliciesConfig(roles={"writer": "lora-a", "rewriter": "lora-a", "checker": "lora-b"},
                              default="lora-b")
    steps = [("call", "writer"), ("reward", 0.2), ("call", "checker"), ("call", None), ("tied", 0.5),
             ("call", "rewriter"), ("call", "writer"), ("final", 1.0)]
    with CountingStore(":memory:") as store:
        ids = []
        for n in range(6):
            store.enqueue_one({"task_id": n // 3}, config=RolloutConfig(max_attempts=1))
            got = store.dequeue(worker_id="w")
            assert got is not None
            spans, _ = scripted_spans(*got, steps[: 4 + n % 5], seed=10 * n)
            store.add_spans([*spans, reward_span(got[0].rollout_id, got[1].attempt_id, n / 6)])
            store.finish_attempt(got[1].attempt_id, "succeeded")
            ids.append(got[0].rollout_id)
        got = samples_by_policy(store, ids, policies, agents=agents, credit=credit)
        assert store.reads == 1
        roles = {"lora-a": {"writer", "rewriter"}, "lora-b": {"checker", ""}}
        want = {p: list(iter_samples(store, ids, agents=sorted(r & set(agents or r)), credit=credit))
                for p, r in roles.items()}

    def key(samples: list) -> list[tuple]:
        return [(s.role, s.rollout_id, s.span_ids, s.reward, s.input_ids.tolist()) for s in samples]

    assert list(got) == ["lora-a", "lora-b"]
    for policy in roles:
        assert key(got[policy]) == key(want[policy]) and got[policy], policy
    assert {s.role for s in got["lora-a"]} == ({"writer", "rewriter"} if agents is None else {"writer"})
    assert {s.role for s in got["lora-b"]} == {"checker", ""}


def test_a_step_on_one_role_changes_its_adapter_only(samples: dict[str, list]) -> None:
    model = _model()
    optimizers = policy_optimizers(model, POLICIES.names, lambda ps: torch.optim.AdamW(ps, lr=CONFIG.lr))
    before = _snapshot(model)
    metrics = step_each_policy(model, optimizers, {"lora-a": samples["lora-a"]}, _step)
    assert metrics["lora-a/skipped"] == 0.0 and "lora-b/skipped" not in metrics
    after = _snapshot(model)
    trained = {name for name, p in model.named_parameters() if any(p is q for q in policy_parameters(model, "lora-a"))}
    assert any(not torch.equal(before[n], after[n]) for n in trained)
    assert all(torch.equal(before[n], after[n]) for n in before if n not in trained)  # lora-b and the base: bit-equal
    assert model.active_adapter == "lora-a"


@pytest.mark.usefixtures("one_thread")
def test_a_joint_step_trains_each_adapter_on_its_own_samples_only(samples: dict[str, list]) -> None:
    """Both policies stepped together end exactly where each would alone: neither saw the other's samples."""
    make = lambda ps: torch.optim.AdamW(ps, lr=CONFIG.lr)  # noqa: E731
    joint, alone = _model(), _model()
    step_each_policy(joint, policy_optimizers(joint, POLICIES.names, make), samples, _step)
    for policy in POLICIES.names:
        model = copy.deepcopy(alone)
        step_each_policy(model, policy_optimizers(model, POLICIES.names, make), {policy: samples[policy]}, _step)
        for mine, theirs in zip(policy_parameters(joint, policy), policy_parameters(model, policy), strict=True):
            assert torch.equal(mine, theirs), policy
    moved = {p: any(not torch.equal(a, b) for a, b in zip(policy_parameters(joint, p), policy_parameters(alone, p),
                                                             strict=True)) for p in POLICIES.names}
    assert moved == {"lora-a": True, "lora-b": True}


def test_a_policy_whose_samples_did_not_vary_in_a_group_is_not_updated() -> None:
    """The writer wrote the same thing in every rollout of a task, the checker did not, and the rewards varied: the
    writer's samples carry no signal (identical samples, advantages summing to zero), so its step is skipped and
    its adapter stays bit-identical, while the checker's moves; the step reports exactly the policy that moved."""
    with SpanStore(":memory:") as store:
        samples = samples_by_policy(store, _record(store, same_writer=True), POLICIES, group_key="task_id")
    assert {len({tuple(s.input_ids) for s in samples["lora-a"] if s.group_id == g}) for g in ("0", "1")} == {1}
    model = _model()
    optimizers = policy_optimizers(model, POLICIES.names,
                                   lambda ps: torch.optim.AdamW(ps, lr=CONFIG.lr, weight_decay=CONFIG.weight_decay))
    before = _snapshot(model)
    metrics = step_each_policy(model, optimizers, samples, _step)
    moved = {p: any(not torch.equal(before[n], q) for n, q in model.named_parameters()
                    if any(q is r for r in policy_parameters(model, p))) for p in POLICIES.names}
    assert moved == {"lora-a": False, "lora-b": True}
    assert metrics["lora-a/skipped"] == 1.0 and metrics["lora-a/n_groups_cancelled"] == TASKS
    assert metrics["lora-b/skipped"] == 0.0


@pytest.mark.usefixtures("one_thread")
def test_the_per_role_trainer_steps_each_policy_on_its_roles_and_marks_only_the_changed_for_the_push(
        tmp_path) -> None:
    """The framework's trainer for ``policies:`` (``spanlab.policies.trainer``): one read split by policy, each
    policy stepped on its own adapter exactly as ``step_each_policy`` does, and only the policies that moved are
    left for the push (the writer's identical calls give it no signal)."""
    from functools import partial

    from spanlab.policies.serving import PolicyAdapters
    from spanlab.policies.trainer import PolicyTrainer

    make = partial(torch.optim.AdamW, lr=CONFIG.lr, weight_decay=CONFIG.weight_decay)
    model, expected = _model(), _model()
    with SpanStore(":memory:") as store:
        ids = _record(store, same_writer=True)
        trainer = PolicyTrainer(model, PolicyAdapters(None, store, POLICIES, tmp_path),  # type: ignore[arg-type]
                                partial(grpo_step, config=CONFIG, pad_id=0), make, agents=None)
        metrics = trainer.update(lambda roles: iter_samples(store, ids, agents=roles, group_key="task_id"))
        samples = samples_by_policy(store, ids, POLICIES, group_key="task_id")
    want = step_each_policy(expected, policy_optimizers(expected, POLICIES.names, make), samples, _step)
    assert trainer.changed == ["lora-b"]  # the push serves lora-b's next version only
    assert metrics["lora-a/skipped"] == 1.0 and metrics["lora-b/loss"] == want["lora-b/loss"]
    assert metrics["skipped"] == 0.0 and metrics["policies_updated"] == 1.0
    assert metrics["n_samples"] == float(sum(len(s) for s in samples.values()))
    for policy in POLICIES.names:
        for mine, theirs in zip(policy_parameters(model, policy), policy_parameters(expected, policy), strict=True):
            assert torch.equal(mine, theirs), policy
