"""The one-process trainer on a GPU (``trainer: {device: gpu}``): the job loads the policy onto the GPU, and the
warm start's SFT and the GRPO update run there and give what they give on the CPU. The weights it pushes, its
checkpoints and its resume state still come back as CPU tensors.

Skipped without a CUDA GPU (CI has none). On a GPU machine:
``pytest tests/algos/test_one_gpu_trainer.py``. Its last run is recorded in docs/results.md (GPU).
"""

from __future__ import annotations

import copy
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch

from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.engine.weights import save_weights
from spanlab.jobs.groups import policy_recorder
from spanlab.store import SpanStore
from spanlab.training.data_parallel import load_trainable_model
from spanlab.training.policy import open_policy
from spanlab.training.resume import load_state, restore_optimizer, restore_weights, save_state
from spanlab.training.settings import SFTConfig
from spanlab.training.supervised import sft_train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
VOCAB = 512


def _model_dir(out: Path) -> Path:
    """A random 2-layer Llama with a word-level tokenizer: an HF folder ``open_policy`` loads as a user's."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(out)
    words = {f"w{i}": i for i in range(VOCAB)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(words, unk_token="w0")),
                            eos_token="w1", pad_token="w0").save_pretrained(out)
    return out


def _samples(n: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p, r = int(rng.integers(20, 40)), int(rng.integers(5, 15))
        mask = np.r_[np.zeros(p, np.uint8), np.ones(r, np.uint8)]
        logprobs = np.where(mask == 1, -rng.random(p + r) * 3, 0).astype(np.float32)
        ids = rng.integers(2, VOCAB, p + r, dtype=np.int32)
        out.append(Sample(f"r{i}", f"g{i // 4}", ids, mask, logprobs, reward=float(i % 4 in (0, 3))))
    return out


def test_the_policy_trains_on_the_gpu_as_on_the_cpu(tmp_path: Path) -> None:
    path = _model_dir(tmp_path / "model")
    cpu = load_trainable_model(path)
    with ExitStack() as stack, SpanStore(":memory:") as store:
        policy = open_policy(stack, model_name=str(path), root_url="http://127.0.0.1:9", served="m",
                             record=policy_recorder(store), run_dir=tmp_path / "run", lora=None, torch_threads=None,
                             device="cuda")
        gpu = policy.model
        assert {p.device.type for p in gpu.parameters()} == {"cuda"}

        sft = SFTConfig(lr=1e-3, batch_size=4, seed=0)
        on_gpu = sft_train(gpu, _samples(8, seed=1), sft, pad_id=0)
        on_cpu = sft_train(cpu, _samples(8, seed=1), sft, pad_id=0)
        assert on_gpu["sft_loss_first"] == pytest.approx(on_cpu["sft_loss_first"], rel=1e-4)
        assert on_gpu["sft_loss_last"] == pytest.approx(on_cpu["sft_loss_last"], rel=1e-2)

        # From the same weights, the GRPO update on each device. SGD, so a step's change is its gradient: Adam's
        # normalised step would turn a near-zero gradient's rounding into a full-size difference.
        cpu.load_state_dict({k: v.cpu() for k, v in gpu.state_dict().items()})
        config = GRPOConfig(lr=0.1, micro_batch_tokens=128)
        gpu_opt, cpu_opt = torch.optim.SGD(gpu.parameters(), lr=config.lr), torch.optim.SGD(cpu.parameters(),
                                                                                             lr=config.lr)
        for step in range(2):
            g = grpo_step(gpu, gpu_opt, _samples(8, seed=10 + step), config, pad_id=0)
            c = grpo_step(cpu, cpu_opt, _samples(8, seed=10 + step), config, pad_id=0)
            assert g["tokens"] == c["tokens"]
            assert g["grad_norm"] == pytest.approx(c["grad_norm"], rel=1e-3), step
            assert g["loss"] == pytest.approx(c["loss"], rel=1e-3, abs=1e-6), step
        for (name, p_gpu), p_cpu in zip(gpu.named_parameters(), cpu.parameters(), strict=True):
            torch.testing.assert_close(p_gpu.detach().cpu(), p_cpu.detach(), rtol=1e-3, atol=1e-5, msg=name)

        from safetensors.torch import load_file

        pushed = load_file(save_weights(gpu.state_dict(), tmp_path / "weights") / "model.safetensors")
        assert {t.device.type for t in pushed.values()} == {"cpu"}
        torch.testing.assert_close(pushed["model.norm.weight"], gpu.model.norm.weight.detach().cpu())

        momentum = torch.optim.SGD(gpu.parameters(), lr=config.lr, momentum=0.9)  # an optimizer with a state
        grpo_step(gpu, momentum, _samples(8, seed=20), config, pad_id=0)
        save_state(tmp_path / "run", {"step": 3}, gpu, momentum)
        state = load_state(tmp_path / "run")
        assert state is not None and state.info["step"] == 3
        fresh = copy.deepcopy(cpu)
        restore_weights(state, fresh)  # a GPU run's state resumes on any device
        for p_fresh, p_gpu in zip(fresh.parameters(), gpu.parameters(), strict=True):
            torch.testing.assert_close(p_fresh.detach(), p_gpu.detach().cpu(), rtol=0, atol=0)
        resumed = torch.optim.SGD(gpu.parameters(), lr=config.lr, momentum=0.9)
        assert restore_optimizer(state, resumed)
        assert {s["momentum_buffer"].device.type for s in resumed.state.values()} == {"cuda"}
