"""``grpo.bf16``: the update's forward passes in bfloat16 under ``torch.autocast``, with fp32 weights, gradients
and optimizer state. It runs the same way on the CPU, so CI checks it here: the update lands close to the fp32
one but not on it, and the weights stay fp32. docs/results.md (GPU) has its speed on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spanlab.algos.grpo.update import grpo_step
from spanlab.training.data_parallel import load_trainable_model
from tests.algos.test_grpo_parallel import CONFIG, SAMPLES_SEED, _batch, _flat, _toy_model


@pytest.mark.parametrize("epochs", [1, 2])  # 2: the frozen "old" logprobs are taken under autocast too
def test_bf16_forward_passes_keep_fp32_weights_and_land_near_the_fp32_update(tmp_path: Path, epochs: int) -> None:
    path = _toy_model(tmp_path / "model", tied=True)
    fp32, bf16 = load_trainable_model(path), load_trainable_model(path)
    start = _flat(fp32)
    samples = _batch(SAMPLES_SEED, 16, shared=20)  # a shared prefix: the cached-prefix forward runs in bf16 too
    config = CONFIG.model_copy(update={"epochs_per_batch": epochs})
    a = grpo_step(fp32, torch.optim.SGD(fp32.parameters(), lr=0.1), samples, config, pad_id=0)
    b = grpo_step(bf16, torch.optim.SGD(bf16.parameters(), lr=0.1), samples,
                  config.model_copy(update={"bf16": True}), pad_id=0)
    assert {p.dtype for p in bf16.parameters()} == {torch.float32}
    assert {p.grad is None for p in bf16.parameters()} == {True}  # zeroed after the step, as in fp32
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=0.05)
    assert b["grad_norm"] != a["grad_norm"]  # bfloat16 rounding shows: autocast was on
    assert b["drift_logp_abs_diff"] == pytest.approx(a["drift_logp_abs_diff"], rel=0.05)
    step32, step16 = _flat(fp32) - start, _flat(bf16) - start
    cos = torch.nn.functional.cosine_similarity(step32, step16, dim=0)
    assert float(cos) > 0.99, float(cos)
