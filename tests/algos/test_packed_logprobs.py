"""Packed, prefix-shared, chunked log-probs equal the plain computation: each row through the model on its own,
full logits, log_softmax. Values, gradients and a whole GRPO step (its loss and its update), on a tiny random
Llama with grouped-query attention, in float32 and at a tight tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spanlab.adapters.samples import Sample, collate
from spanlab.algos.grpo.update import GRPOConfig, grpo_step, policy_loss, sample_advantages
from spanlab.training.lm_head import target_logprobs
from spanlab.training.logprobs import token_logprobs
from spanlab.training.packing import pack_rows, packed_micro_batches, packed_size

VOCAB = 97


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        tie_word_embeddings=True)).train()


def _rows(seed: int = 0) -> list[np.ndarray]:
    """Three groups sharing a 30-token system prompt, each with its own 20-token task, four responses each; plus a
    duplicate row, a row that is a prefix of another, a row sharing only 5 tokens, and a row sharing nothing."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, VOCAB, 30)
    rows = []
    for _ in range(3):
        prompt = np.r_[system, rng.integers(0, VOCAB, 20)]
        rows += [np.r_[prompt, rng.integers(0, VOCAB, int(rng.integers(3, 12)))] for _ in range(4)]
    rows += [rows[0].copy(), rows[5][:41].copy(), np.r_[system[:5], rng.integers(0, VOCAB, 9)],
             rng.integers(0, VOCAB, 7)]
    return [r.astype(np.int64) for r in rows]


def _padded(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(map(len, rows))
    ids, attn = torch.zeros(len(rows), T, dtype=torch.long), torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)], attn[b, :len(r)] = torch.from_numpy(r), 1
    return ids, attn


def _reference(model, rows: list[np.ndarray], mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each row alone through the model, full logits, log_softmax: what the packed path must reproduce."""
    out = torch.zeros(mask.shape)
    for b, r in enumerate(rows):
        ids = torch.from_numpy(r)[None]
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, -1)
        out[b, 1:len(r)] = logp[:-1].gather(1, ids[0, 1:, None])[:, 0]
    return out * mask


def test_packing_runs_every_shared_prefix_once_and_maps_back_to_every_row() -> None:
    rows = _rows()
    packed = pack_rows(rows, max(map(len, rows)))
    for b, r in enumerate(rows):
        assert torch.equal(packed.input_ids[packed.index_B_T[b, :len(r)]], torch.from_numpy(r))
        assert torch.equal(packed.position_ids[packed.index_B_T[b, :len(r)]], torch.arange(len(r)))
    # system once, each task once, each response once; the duplicate and the prefix row add nothing; the row sharing
    # 5 tokens with 14 others shares them (70 saved >= MIN_SHARED_TOKENS); the unrelated row is laid out whole
    distinct = 30 + 3 * 20 + sum(len(r) - 50 for r in rows[:12]) + 9 + 7
    assert packed.size == distinct
    assert packed_size(sorted(rows, key=lambda r: r.tolist())) <= distinct
    plain = pack_rows(rows, max(map(len, rows)), share=False)
    assert plain.size == sum(map(len, rows)) and all(n.keys is None for n in plain.nodes)


def test_packed_micro_batches_keep_sharing_rows_together_within_the_budget() -> None:
    rows = _rows()
    chunks = list(packed_micro_batches(rows, 120))
    assert sorted(i for c in chunks for i in c) == list(range(len(rows)))
    for c in chunks:
        assert packed_size([rows[i] for i in c]) <= 120 or len(c) == 1
    first_group = next(c for c in chunks if 1 in c)
    assert {0, 1, 2, 3} <= set(first_group)  # a group's four responses share its prompt in one forward


@pytest.mark.parametrize("share", [True, False])
def test_packed_logprobs_and_gradients_equal_each_row_run_alone(share: bool) -> None:
    model, rows = _model(), _rows()
    ids, attn = _padded(rows)
    mask = attn.clone().float()
    mask[:, :25] = 0
    mask[:, 0] = 0
    weights_T = torch.linspace(-1.0, 2.0, ids.shape[1])  # position-dependent: a real gradient test

    def grads(logp: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        (logp * weights_T).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    got = token_logprobs(model, ids, attn, positions_mask=mask > 0, temperature=0.7, share_prefix=share)
    got_grads = grads(got)
    want = _reference(model, rows, mask, 0.7)
    want_grads = grads(want)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_chunked_lm_head_equals_full_logits_with_bias_and_small_chunks() -> None:
    torch.manual_seed(1)
    head = torch.nn.Linear(16, VOCAB, bias=True)
    hidden = torch.randn(23, 16, requires_grad=True)
    targets = torch.randint(0, VOCAB, (23,))
    weights = torch.randn(23)
    got = target_logprobs(hidden, head, targets, temperature=1.3, chunk_elements=5 * VOCAB)  # 5 positions a chunk
    got_grads = torch.autograd.grad((got * weights).sum(), [hidden, head.weight, head.bias])
    want = torch.log_softmax(head(hidden) / 1.3, -1).gather(1, targets[:, None])[:, 0]
    want_grads = torch.autograd.grad((want * weights).sum(), [hidden, head.weight, head.bias])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_grpo_step_loss_and_update_equal_the_unpacked_reference() -> None:
    """One GRPO step (packed micro-batches, shared prompts, chunked head) moves the weights exactly as plain SGD
    on the loss computed row by row with full logits."""
    rows = _rows()[:12]  # three groups of four sharing their prompts
    rng = np.random.default_rng(3)
    samples = []
    for i, r in enumerate(rows):
        mask = np.zeros(len(r), np.uint8)
        mask[50:] = 1
        engine = np.where(mask == 1, -rng.random(len(r)) * 2, 0).astype(np.float32)
        samples.append(Sample(f"r{i}", f"g{i // 4}", r.astype(np.int32), mask, engine, reward=float(i % 4 in (0, 3))))
    config = GRPOConfig(lr=1.0, max_grad_norm=1e9, micro_batch_tokens=150, tis_cap=2.0, temperature=0.9)
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    metrics = grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), samples, config, pad_id=0)
    assert metrics["skipped"] == 0.0

    reference = _model()  # same seed: the same weights as `model` before its step
    batch = collate(samples, sample_advantages(samples), pad_id=0)
    logp = _reference(reference, rows, batch.loss_mask, 0.9)
    loss, _ = policy_loss(logp, logp.detach(), batch.advantages, batch.loss_mask, clip_low=config.clip_low,
                          clip_high=config.clip_high, aggregation=config.aggregation,
                          engine_logprobs=batch.engine_logprobs, tis_cap=config.tis_cap)
    loss.backward()
    assert metrics["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    for p, p0, ref in zip(model.parameters(), before, reference.parameters(), strict=True):
        torch.testing.assert_close(p0 - p.detach(), ref.grad, rtol=1e-4, atol=1e-6)
