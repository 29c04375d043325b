"""``grpo.credit`` reaches the update: a GRPO step on a tiny random Llama trains each sample with the advantage
its credit setting gives (per role with ``per_turn``, per group by default).

At the step's first epoch the ratio is 1, so with no TIS weight the token-mean loss is ``-sum_b A_b n_b / sum_b
n_b`` (``n_b`` the sample's loss tokens): the step's loss names the advantages it trained with.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.advantages import sample_advantages, turn_advantages
from spanlab.algos.grpo.config import GRPOConfig
from spanlab.algos.grpo.update import grpo_step

VOCAB = 61


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, head_dim=16)).train()


def _samples() -> list[Sample]:
    """One task, three rollouts, a writer and a checker turn each; the writers' returns exceed the checkers'."""
    rng = np.random.default_rng(0)
    out = []
    for i, (writer, checker) in enumerate([(2.0, 1.0), (1.5, 0.0), (0.5, 0.5)]):
        for role, reward in (("writer", writer), ("checker", checker)):
            ids = rng.integers(0, VOCAB, 12 + i).astype(np.int32)
            mask = np.zeros(len(ids), np.uint8)
            mask[8:] = 1
            out.append(Sample(f"r{i}", "task", ids, mask, np.zeros(len(ids), np.float32), reward, role=role))
    return out


def _expected_loss(samples: list[Sample], adv_N: np.ndarray) -> float:
    tokens_N = np.array([int(s.loss_mask.sum()) for s in samples], dtype=np.float64)
    return float(-(adv_N.astype(np.float64) * tokens_N).sum() / tokens_N.sum())


@pytest.mark.parametrize(("credit", "normalize"), [
    ({}, "group"),
    ({"mode": "per_turn", "discount": 0.9}, "group_role"),
    ({"mode": "per_turn", "normalize": "group"}, "group"),
])
def test_the_step_trains_with_the_advantages_its_credit_setting_gives(credit: dict, normalize: str) -> None:
    samples = _samples()
    config = GRPOConfig(lr=1e-3, tis_cap=None, micro_batch_tokens=64, credit=credit)
    assert config.credit.normalization == normalize
    model = _model()
    metrics = grpo_step(model, torch.optim.SGD(model.parameters(), lr=1e-3), samples, config, pad_id=0)
    assert metrics["skipped"] == 0.0 and metrics["n_samples_used"] == len(samples)
    adv_N = turn_advantages(samples, normalize=config.credit.normalization)
    assert metrics["loss"] == pytest.approx(_expected_loss(samples, adv_N), rel=1e-5, abs=1e-7)
    if normalize == "group":  # the default is GRPO's advantage of before, over the group's rollouts
        assert np.array_equal(adv_N, sample_advantages(samples))
    else:
        assert metrics["loss"] != pytest.approx(_expected_loss(samples, sample_advantages(samples)), rel=1e-3)
