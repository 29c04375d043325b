"""GRPO math against values computed by hand: advantages, clipping, masking, aggregation, k3 KL, TIS."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.update import GRPOConfig, group_advantages, policy_loss, sample_advantages
from spanlab.training.logprobs import token_logprobs

EPS = 1e-6


def _loss(logp, old, adv, mask, **kw):
    kw = {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean"} | kw
    return policy_loss(torch.as_tensor(logp, dtype=torch.float32), torch.as_tensor(old, dtype=torch.float32),
                       torch.as_tensor(adv, dtype=torch.float32), torch.as_tensor(mask, dtype=torch.float32), **kw)


# --- advantages ------------------------------------------------------------------------------------
def test_advantages_normalized_by_group_sample_std() -> None:
    adv = group_advantages([1.0, 2.0, 3.0, 5.0, 9.0], ["a", "a", "a", "b", "b"])
    # group a: mean 2, sample std 1; group b: mean 7, sample std sqrt(8) = 2.828427
    expected = [-1 / (1 + EPS), 0.0, 1 / (1 + EPS), -2 / (math.sqrt(8) + EPS), 2 / (math.sqrt(8) + EPS)]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_advantages_without_std_are_centered_rewards() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], ["g"] * 4, scale=False)
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25], rtol=1e-6)


def test_equal_rewards_and_singletons_get_exactly_zero() -> None:
    adv = group_advantages([0.3, 0.3, 0.3, 1.0], ["a", "a", "a", "b"])
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_sample_advantages_count_a_multi_call_rollout_once() -> None:
    def s(rid: str, reward: float) -> Sample:
        return Sample(rid, "g", np.zeros(2, np.int32), np.array([0, 1], np.uint8), np.zeros(2, np.float32), reward)

    adv = sample_advantages([s("r1", 1.0), s("r1", 1.0), s("r1", 1.0), s("r2", 0.0)])
    # units: r1 -> 1, r2 -> 0: mean 0.5, sample std 0.707107 (not 3 copies of r1 against one r2)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    np.testing.assert_allclose(adv, [a, a, a, -a], rtol=1e-6)


# --- clipped surrogate -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "grad", "low", "high"),
    [
        (1.5, 1.0, -1.28, 0.0, 0.0, 1.0),  # above 1+0.28 with A>0: clipped, no gradient
        (1.5, -1.0, 1.5, 1.5, 0.0, 0.0),  # above with A<0: unclipped (pessimistic side)
        (0.5, -1.0, 0.8, 0.0, 1.0, 0.0),  # below 1-0.2 with A<0: clipped
        (0.5, 1.0, -0.5, -0.5, 0.0, 0.0),  # below with A>0: unclipped
        (1.1, 2.0, -2.2, -2.2, 0.0, 0.0),  # inside the band
    ],
)
def test_clipping_sides(ratio: float, adv: float, loss: float, grad: float, low: float, high: float) -> None:
    logp = torch.tensor([[0.0, math.log(ratio)]], requires_grad=True)
    out, m = policy_loss(logp, torch.zeros(1, 2), torch.tensor([adv]), torch.tensor([[0.0, 1.0]]),
                         clip_low=0.2, clip_high=0.28, aggregation="token_mean")
    out.backward()
    assert float(out.detach()) == pytest.approx(loss, rel=1e-6)
    # d/dlogp of -rho*A is -rho*A where unclipped
    assert float(logp.grad[0, 1]) == pytest.approx(grad, rel=1e-6, abs=1e-7)
    assert float(logp.grad[0, 0]) == 0.0
    assert (m["clip_frac_low"], m["clip_frac_high"]) == (low, high)
    assert m["ratio_mean"] == pytest.approx(ratio, rel=1e-6)


def test_masked_tokens_change_neither_loss_nor_gradient() -> None:
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    old = torch.tensor([[0.0, -1.0, -2.0, 0.0]])
    base = torch.tensor([[0.0, -0.9, -2.1, 0.0]])
    garbage = torch.tensor([[50.0, -0.9, -2.1, -70.0]])
    out = []
    for lp in (base, garbage):
        lp = lp.clone().requires_grad_(True)
        loss, _ = policy_loss(lp, old, torch.tensor([1.5]), mask, clip_low=0.2, clip_high=0.28,
                              aggregation="token_mean")
        loss.backward()
        out.append((float(loss.detach()), lp.grad.clone()))
        assert lp.grad[0, 0] == 0 and lp.grad[0, 3] == 0
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-6)
    # hand value: -(1.5*e^0.1 + 1.5*e^-0.1)/2
    assert out[0][0] == pytest.approx(-(1.5 * math.exp(0.1) + 1.5 * math.exp(-0.1)) / 2, rel=1e-6)


# --- aggregation -----------------------------------------------------------------------------------
MASK = [[0, 1, 1], [0, 0, 1]]
ADV = [1.0, -3.0]  # ratio 1 everywhere: per-token loss -A -> row 0: -1, -1; row 1: +3


@pytest.mark.parametrize(
    ("aggregation", "expected", "kw"),
    [
        ("token_mean", (-1 - 1 + 3) / 3, {}),
        ("seq_mean", (-1 + 3) / 2, {}),
        ("constant", (-1 - 1 + 3) / (2 * 4), {"constant_divisor": 4}),
    ],
)
def test_aggregations(aggregation: str, expected: float, kw: dict) -> None:
    zeros = np.zeros((2, 3))
    loss, m = _loss(zeros, zeros, ADV, MASK, aggregation=aggregation, **kw)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert m["loss_tokens"] == 3


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "constant"])
def test_micro_batch_losses_sum_to_the_full_batch_loss(aggregation: str) -> None:
    rng = np.random.default_rng(0)
    logp, old = -rng.random((5, 7)), -rng.random((5, 7))
    mask = (rng.random((5, 7)) > 0.4).astype(np.float32)
    adv = rng.normal(size=5)
    kw = {"aggregation": aggregation, "constant_divisor": 7}
    full, _ = _loss(logp, old, adv, mask, **kw)
    parts = [_loss(logp[s], old[s], adv[s], mask[s], batch_tokens=float(mask.sum()), batch_seqs=5, **kw)[0]
             for s in (slice(0, 2), slice(2, 5))]
    assert float(sum(parts)) == pytest.approx(float(full), rel=1e-5)


# --- KL and truncated importance sampling ----------------------------------------------------------
def test_k3_kl_to_reference() -> None:
    logp = [[0.0, math.log(0.5)]]
    ref = torch.tensor([[0.0, math.log(0.25)]])
    k3 = 0.5 - math.log(0.5) - 1  # exp(ref-logp) - (ref-logp) - 1 = 0.193147
    loss, m = _loss(logp, logp, [0.0], [[0, 1]], ref_logprobs=ref, kl_beta=0.1)
    assert m["kl"] == pytest.approx(k3, rel=1e-6)
    assert float(loss) == pytest.approx(0.1 * k3, rel=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        _loss(logp, logp, [0.0], [[0, 1]], kl_beta=0.1)


def test_tis_weight_is_capped_and_ignores_unknown_engine_logprobs() -> None:
    old = [[0.0, -1.0, -2.0, -1.0]]
    engine = torch.tensor([[0.0, -2.0, -1.5, float("nan")]])  # weights: min(e^1, 2)=2, e^-0.5, 1 (unknown)
    w = [2.0, math.exp(-0.5), 1.0]
    loss, m = _loss(old, old, [1.0], [[0, 1, 1, 1]], engine_logprobs=engine, tis_cap=2.0)
    assert float(loss) == pytest.approx(-sum(w) / 3, rel=1e-6)
    assert m["tis_weight_mean"] == pytest.approx(sum(w) / 3, rel=1e-6)
    assert m["tis_capped_frac"] == pytest.approx(1 / 3)
    off, m_off = _loss(old, old, [1.0], [[0, 1, 1, 1]], engine_logprobs=engine, tis_cap=None)
    assert float(off) == pytest.approx(-1.0) and "tis_weight_mean" not in m_off


def test_mismatch_kl_is_zero_on_policy_and_the_k3_estimate_off_it() -> None:
    old = [[0.0, -1.0, -2.0, -1.0]]
    _, same = _loss(old, old, [1.0], [[0, 1, 1, 1]], engine_logprobs=torch.tensor(old), tis_cap=2.0)
    assert same["mismatch_kl"] == 0.0
    engine = torch.tensor([[0.0, -2.0, -1.5, float("nan")]])  # log r = trainer - engine: 1, -0.5, unknown (0)
    _, off = _loss(old, old, [1.0], [[0, 1, 1, 1]], engine_logprobs=engine, tis_cap=2.0)
    k3 = [math.exp(1) - 1 - 1, math.exp(-0.5) + 0.5 - 1, 0.0]
    assert off["mismatch_kl"] == pytest.approx(sum(k3) / 3, rel=1e-6)


# --- config and logprobs ---------------------------------------------------------------------------
def test_config_rejects_bad_options() -> None:
    with pytest.raises(ValidationError, match="group_size"):
        GRPOConfig(group_size=1)
    with pytest.raises(ValidationError, match="constant_divisor"):
        GRPOConfig(aggregation="constant")
    with pytest.raises(ValidationError):
        GRPOConfig(loss_type="dr_grpo")
    with pytest.raises(ValidationError):
        GRPOConfig(aggregation="sum")
    assert GRPOConfig(aggregation="constant", constant_divisor=64, scale_rewards=False).constant_divisor == 64


def test_token_logprobs_match_full_log_softmax_at_selected_positions() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16)).eval()
    ids = torch.randint(0, 40, (2, 6))
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    positions = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 0, 1, 1, 1, 0]])
    with torch.no_grad():
        got = token_logprobs(model, ids, attn, positions_mask=positions)
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits, -1)
    want = torch.zeros(2, 6)
    for b, t in [(0, 3), (0, 4), (0, 5), (1, 2), (1, 3)]:  # selected, t > 0, not padding
        want[b, t] = full[b, t - 1, ids[b, t]]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    hot = token_logprobs(model, ids, attn, temperature=0.5)
    assert hot[0, 1] != got[0, 1] and hot[0, 0] == 0 and hot[1, 5] == 0


def test_shared_prefix_is_exact_in_value_and_gradient() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from spanlab.training.logprobs import shared_prefix_len

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    prefix = torch.randint(0, 50, (20,))
    rows = [torch.cat([prefix, torch.randint(0, 50, (n,))]) for n in (5, 9, 3)]
    T = max(len(r) for r in rows)
    ids = torch.zeros(3, T, dtype=torch.long)
    attn = torch.zeros(3, T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)], attn[b, : len(r)] = r, 1
    assert shared_prefix_len(ids, attn) >= 20  # random suffix tokens may extend it; never past the shortest row
    assert shared_prefix_len(ids, attn) <= len(rows[2]) - 1
    mask = attn.clone()
    mask[:, :10] = 0

    def run(share: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        lp = token_logprobs(model, ids, attn, positions_mask=mask, share_prefix=share)
        (lp * torch.arange(1, T + 1)).sum().backward()  # position-dependent weights: a real gradient test
        return lp.detach(), [p.grad.clone() for p in model.parameters()]

    lp_plain, grads_plain = run(False)
    lp_shared, grads_shared = run(True)
    torch.testing.assert_close(lp_shared, lp_plain, rtol=1e-4, atol=1e-5)
    for g_shared, g_plain in zip(grads_shared, grads_plain, strict=True):
        torch.testing.assert_close(g_shared, g_plain, rtol=1e-3, atol=1e-5)
