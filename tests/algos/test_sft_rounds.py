"""SFT on a reward-filtered dataset: the filtered set's NLL goes down, weights act, the table round-trips.

A tiny random Llama (vocab 16) and hand-made samples: the kept examples follow one pattern (response =
the prompt's tokens + 1), the dropped ones another, so "the loss on the filtered set went down" is
measured on held-apart forward passes, not read off the training loop.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spanlab.adapters.filtered_dataset import FilterConfig, filter_samples, to_table
from spanlab.adapters.samples import Sample, collate
from spanlab.algos.sft.config import SFTRoundsConfig
from spanlab.algos.sft.rounds import choose_backend, samples_from_table
from spanlab.errors import ConfigError
from spanlab.training.logprobs import token_logprobs
from spanlab.training.model import LoraConfig
from spanlab.training.supervised import SFTConfig, sft_train

VOCAB = 16


def _tiny_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def _samples(n_groups: int = 6, per_group: int = 4) -> list[Sample]:
    """Per group: the rewarded samples answer prompt+1, the others answer random tokens."""
    rng = np.random.default_rng(0)
    out = []
    for g in range(n_groups):
        prompt = rng.integers(1, VOCAB - 1, 4)
        for k in range(per_group):
            good = k % 2 == 0
            response = (prompt + 1) if good else rng.integers(1, VOCAB, 4)
            ids = np.concatenate([prompt, response]).astype(np.int32)
            mask = np.array([0] * 4 + [1] * 4, dtype=np.uint8)
            out.append(Sample(f"r{g}-{k}", f"g{g}", ids, mask, np.zeros(8, np.float32), float(good), [f"s{g}-{k}"]))
    return out


@torch.no_grad()
def _nll(model: torch.nn.Module, samples: list[Sample]) -> float:
    batch = collate(samples, torch.zeros(len(samples)), pad_id=0)
    logp = token_logprobs(model, batch.input_ids, batch.attention_mask, positions_mask=batch.loss_mask)
    return float(-(logp * batch.loss_mask).sum() / batch.loss_mask.sum())


def test_training_on_the_filtered_table_lowers_its_nll() -> None:
    kept, stats = filter_samples(_samples(), FilterConfig(rule="threshold", min_reward=1.0))  # dupes: 2 good per group
    assert (stats.kept, stats.dropped_duplicate) == (6, 6) and all(s.reward == 1.0 for s, _ in kept)
    samples, weights = samples_from_table(to_table(kept))
    assert [s.input_ids.tolist() for s in samples] == [s.input_ids.tolist() for s, _ in kept]
    assert [s.loss_mask.tolist() for s in samples] == [s.loss_mask.tolist() for s, _ in kept]
    model = _tiny_model()
    before = _nll(model, samples)
    metrics = sft_train(model, samples, SFTConfig(lr=3e-3, epochs=8, batch_size=4), pad_id=0, weights=weights)
    after = _nll(model, samples)
    assert after < 0.7 * before, (before, after)
    assert metrics["sft_examples"] == 6 and metrics["sft_loss_last"] < metrics["sft_loss_first"]


def test_zero_weights_leave_the_model_unchanged_and_lora_trains_only_the_adapter() -> None:
    samples = [s for s in _samples() if s.reward == 1.0]
    model = _tiny_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    sft_train(model, samples, SFTConfig(lr=1e-2, epochs=1, batch_size=4, weight_decay=0.0), pad_id=0,
              weights=[0.0] * len(samples))
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())

    from spanlab.training.model import apply_lora

    pytest.importorskip("peft", reason="LoRA needs peft (the 'train' extra)")
    lora = apply_lora(_tiny_model(), LoraConfig(rank=4, alpha=8))
    base = {k: v.clone() for k, v in lora.state_dict().items() if "lora_" not in k}
    before = _nll(lora, samples)
    sft_train(lora, samples, SFTConfig(lr=1e-2, epochs=4, batch_size=4), pad_id=0)
    assert _nll(lora, samples) < before
    assert all(torch.equal(base[k], v) for k, v in lora.state_dict().items() if "lora_" not in k)


def test_weights_must_match_the_samples_and_unsloth_on_request_says_how_to_get_it() -> None:
    samples = _samples()[:2]
    with pytest.raises(ValueError):
        sft_train(_tiny_model(), samples, SFTConfig(), pad_id=0, weights=[1.0])
    assert choose_backend(SFTRoundsConfig(backend="torch")) == "torch"
    assert choose_backend(SFTRoundsConfig(backend="auto", save="adapter")) == "torch"
    with pytest.raises(ConfigError, match=r"save: adapter is not supported with sft\.backend: unsloth"):
        choose_backend(SFTRoundsConfig(backend="unsloth", save="adapter"))
    from spanlab.algos.sft.unsloth import unsloth_available

    if not unsloth_available():
        with pytest.raises(ImportError, match="unsloth is not importable"):
            choose_backend(SFTRoundsConfig(backend="unsloth"))
        assert choose_backend(SFTRoundsConfig(backend="auto")) == "torch"
