"""Demonstrations as spans: stored with their exact IDs and mask, read back the same on both store kinds; the
``demonstrations`` view; GRPO's demonstration term (PPO-ptx) adds exactly ``coef`` x the demonstrations' NLL
gradient to an update."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from spanlab.adapters.conversation import sft_sample
from spanlab.adapters.demonstrations import read_demonstrations, record_demonstrations
from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.config import DemonstrationTerm
from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.store import StoreAPI
from spanlab.training.logprobs import token_logprobs


def _demo(seed: int, n: int = 12) -> Sample:
    rng = np.random.default_rng(seed)
    mask = np.zeros(n, np.uint8)
    mask[4:7] = 1  # an assistant turn, a tool result (0), then the answer turn
    mask[9:] = 1
    return sft_sample(rng.integers(0, 40, n).astype(np.int32), mask)


def test_demonstrations_round_trip_exactly_and_by_run_and_source(any_store: StoreAPI) -> None:
    demos = [_demo(i) for i in range(5)]
    tasks = [{"task_id": f"t{i}", "level": 1 + i % 3} for i in range(5)]
    record_demonstrations(any_store, demos[:3], tasks[:3], model="m", source="warm_start", run_id="run-a",
                          conversations=[[{"role": "user", "content": f"q{i}"}] for i in range(3)])
    record_demonstrations(any_store, demos[3:], tasks[3:], model="m", source="grpo.demonstrations", run_id="run-a")
    record_demonstrations(any_store, demos[:1], tasks[:1], model="m", source="warm_start", run_id="run-b")

    back = read_demonstrations(any_store, run_id="run-a", sources=["warm_start"])
    assert len(back) == 3
    for want, got in zip(demos[:3], back, strict=True):
        assert got.input_ids.tolist() == want.input_ids.tolist()
        assert got.loss_mask.tolist() == want.loss_mask.tolist()
        assert len(got.span_ids) == 1
    assert len(read_demonstrations(any_store, run_id="run-a")) == 5
    assert len(read_demonstrations(any_store, run_id="run-b")) == 1
    assert read_demonstrations(any_store, run_id="run-c") == []

    rows = any_store.query("SELECT source, task_id, level, num_tokens, trained_tokens FROM demonstrations "
                           "WHERE run_id = 'run-a' ORDER BY task_id").to_pylist()
    assert [(r["source"], r["task_id"], r["level"]) for r in rows] == [
        ("warm_start", "t0", 1), ("warm_start", "t1", 2), ("warm_start", "t2", 3),
        ("grpo.demonstrations", "t3", 1), ("grpo.demonstrations", "t4", 2)]
    assert {(r["num_tokens"], r["trained_tokens"]) for r in rows} == {(12, 6)}
    # a demonstration is not a call the engine made: the calls view does not count it
    assert any_store.query("SELECT count(*) AS n FROM llm_calls").to_pylist() == [{"n": 0}]


def _tiny_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, head_dim=16))


def _grpo_samples() -> list[Sample]:
    rng = np.random.default_rng(7)
    out = []
    for i, reward in enumerate([1.0, 0.0, 1.0, 0.0]):
        ids = rng.integers(0, 40, 10).astype(np.int32)
        mask = np.array([0] * 5 + [1] * 5, np.uint8)
        out.append(Sample(f"r{i}", "g", ids, mask, np.full(10, -3.0, np.float32), reward))
    return out


def test_demonstration_term_adds_coef_times_the_nll_gradient() -> None:
    """One SGD step with the term equals one without it plus lr x coef x the demonstrations' NLL gradient."""
    demos = [_demo(i) for i in range(3)]
    lr, coef = 0.5, 0.3
    base = _tiny_model()
    rl_only, mixed = copy.deepcopy(base), copy.deepcopy(base)
    plain = GRPOConfig(tis_cap=None, max_grad_norm=1e9)
    with_term = GRPOConfig(tis_cap=None, max_grad_norm=1e9, demonstrations=DemonstrationTerm(coef=coef))
    grpo_step(rl_only, torch.optim.SGD(rl_only.parameters(), lr=lr), _grpo_samples(), plain, pad_id=0)
    metrics = grpo_step(mixed, torch.optim.SGD(mixed.parameters(), lr=lr), _grpo_samples(), with_term, pad_id=0,
                        demos=demos)

    nll_model = copy.deepcopy(base)
    ids = torch.as_tensor(np.stack([d.input_ids for d in demos]).astype(np.int64))
    mask = torch.as_tensor(np.stack([d.loss_mask for d in demos]).astype(np.float32))
    lp = token_logprobs(nll_model, ids, torch.ones_like(ids), positions_mask=mask > 0)
    nll = -(lp * mask).sum() / mask.sum()
    nll.backward()
    assert metrics["demo_nll"] == pytest.approx(float(nll.detach()), rel=1e-4)
    assert metrics["demo_tokens"] == float(mask.sum())
    for p_rl, p_mixed, p_nll in zip(rl_only.parameters(), mixed.parameters(), nll_model.parameters(), strict=True):
        torch.testing.assert_close(p_mixed, p_rl - lr * coef * p_nll.grad, rtol=1e-4, atol=1e-6)


def test_the_term_is_left_out_without_the_config_or_demos() -> None:
    model = _tiny_model()
    metrics = grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), _grpo_samples(), GRPOConfig(), pad_id=0,
                        demos=[_demo(0)])
    assert "demo_nll" not in metrics
