"""A warm start per policy: each role's adapter trained on its own role's demonstrations only.

The demonstrations come the way a run gets them: the writer's generated from the task set, the checker's and the
rewriter's mined from real SQL rollouts recorded in a real store (tests/sql_scripted.py) and filtered per role by
SFT's reward filter. The model is a tiny random Llama with the real SmolLM2 tokenizer and an adapter per role.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.recorded_rollouts import read_rollouts
from spanlab.adapters.role_demos import role_sets
from spanlab.adapters.samples import Sample
from spanlab.agents.sql import demonstration
from spanlab.agents.sql.mining import mine_demonstrations
from spanlab.policies.adapters import adapter_state, multi_adapter_model
from spanlab.policies.config import PoliciesConfig
from spanlab.policies.warm_start import demos_by_policy, warm_start_policies
from spanlab.store import SpanStore
from spanlab.training.settings import SFTConfig
from tests.sql_scripted import TASKS, record_scripted

PER_ROLE = PoliciesConfig(roles={"writer": "w", "checker": "c", "rewriter": "fix"},
                          lora={"rank": 4, "alpha": 8, "target_modules": ("q_proj", "v_proj")})
SFT = SFTConfig(lr=1e-2, epochs=1, batch_size=2, max_len=2048)


@pytest.fixture(scope="module")
def by_role(default_model_dir: Path) -> dict[str, list[Sample]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    with SpanStore(":memory:") as store:
        record_scripted(store)
        sets = role_sets(mine_demonstrations(read_rollouts(store)), tokenizer)
    writer = [encode_conversation(tokenizer, demonstration(t)["messages"]) for t in TASKS[:3]]
    return {"writer": writer, **{role: s.samples for role, s in sets.items()}}


def _model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return multi_adapter_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), PER_ROLE)


def _base(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_policy_gets_its_own_roles_demonstrations(by_role: dict[str, list[Sample]]) -> None:
    assert {r: len(s) for r, s in by_role.items()} == {"writer": 3, "checker": 10, "rewriter": 5}
    assert {p: len(s) for p, s in demos_by_policy(by_role, PER_ROLE).items()} == {"c": 10, "fix": 5, "w": 3}
    shared = PoliciesConfig(roles={"writer": "s", "checker": "s", "rewriter": "s"})
    assert {p: len(s) for p, s in demos_by_policy(by_role, shared).items()} == {"s": 18}
    writer_only = PoliciesConfig(roles={"writer": "w"})  # the other roles go to the base model: never trained here
    assert {p: len(s) for p, s in demos_by_policy(by_role, writer_only).items()} == {"w": 3}


def test_a_policy_trains_on_its_own_demonstrations_and_nothing_else_moves(
        by_role: dict[str, list[Sample]], tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    before = {p: adapter_state(model, p) for p in PER_ROLE.names}
    base = _base(model)
    checker_only = {"c": demos_by_policy(by_role, PER_ROLE)["c"]}
    metrics = warm_start_policies(model, checker_only, SFT, pad_id=0)
    assert metrics["c/sft_steps"] == 5 and {k.split("/")[0] for k in metrics} == {"c"}  # 10 demos, batches of 2
    assert not _same(adapter_state(model, "c"), before["c"])
    assert _same(adapter_state(model, "w"), before["w"]) and _same(adapter_state(model, "fix"), before["fix"])
    assert _same(_base(model), base)
    assert model.active_adapter == "c"  # the first policy (sorted names) was active before, and is again


def test_every_policy_at_once_equals_each_trained_alone(by_role: dict[str, list[Sample]], tiny_model_dir: Path) -> None:
    """Training all three adapters in one warm start gives each the weights it gets when trained alone on its own
    demonstrations: no adapter saw another role's demonstrations."""
    samples = demos_by_policy(by_role, PER_ROLE)
    together = _model(tiny_model_dir)
    start = {p: adapter_state(together, p) for p in PER_ROLE.names}
    warm_start_policies(together, samples, SFT, pad_id=0)
    for policy in PER_ROLE.names:
        alone = _model(tiny_model_dir)
        assert _same(adapter_state(alone, policy), start[policy])  # the same start, from init_seed
        warm_start_policies(alone, {policy: samples[policy]}, SFT, pad_id=0)
        assert _same(adapter_state(alone, policy), adapter_state(together, policy)), policy
        assert not _same(adapter_state(together, policy), start[policy]), policy
