"""Weight sync against the shared real server: LoRA hot-load and full in-place reload.

Each test leaves the server as it found it (adapters unloaded, original weights reloaded), since
the rest of the session shares it. Outputs are compared with greedy decoding and logprobs.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from spanlab.engine.weights import WeightSyncClient, save_weights, write_peft_lora

pytestmark = pytest.mark.vllm

PROMPT = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"


def _greedy(vllm_server: Any, model: str | None = None, max_tokens: int = 6,
            ignore_eos: bool = False) -> tuple[list[int], list[float]]:
    resp = httpx.post(f"{vllm_server.base_url}/completions", timeout=120, json={
        "model": model or vllm_server.model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
        "logprobs": 0, "return_token_ids": True, "ignore_eos": ignore_eos})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def random_lora(out_dir: Path, *, seed: int, scale: float = 0.05, rank: int = 8) -> Path:
    """A PEFT adapter on q_proj/v_proj of SmolLM2-135M (30 layers, hidden 576, kv dim 192)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(30):
        for proj, out_dim in (("q_proj", 576), ("v_proj", 192)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(rank, 576, generator=gen) * scale
            weights[f"{prefix}.lora_B.weight"] = torch.randn(out_dim, rank, generator=gen) * scale
    return write_peft_lora(out_dir, weights, rank=rank, alpha=2 * rank, target_modules=["q_proj", "v_proj"])


@pytest.fixture()
def sync(vllm_server: Any) -> Any:
    with WeightSyncClient(vllm_server.root_url) as client:
        yield client


def test_lora_hot_load_replace_and_unload(vllm_server: Any, sync: WeightSyncClient, tmp_path: Path) -> None:
    base = _greedy(vllm_server)
    sync.load_lora("policy", random_lora(tmp_path / "a", seed=1))
    try:
        assert "policy" in sync.list_models()
        with_a = _greedy(vllm_server, "policy")
        assert with_a != base
        assert _greedy(vllm_server) == base  # the base name still serves the base weights
        timing = sync.load_lora("policy", random_lora(tmp_path / "b", seed=2), inplace=True)
        assert timing.total_s < 10
        with_b = _greedy(vllm_server, "policy")
        assert with_b != with_a
    finally:
        sync.unload_lora("policy")
    assert "policy" not in sync.list_models()


def test_a_paused_lora_push_lets_a_running_request_finish_on_the_old_adapter(
        vllm_server: Any, sync: WeightSyncClient, tmp_path: Path) -> None:
    """The async loop's push (docs/async.md): a request decoding during the push ends as it would have without it."""
    sync.load_lora("policy", random_lora(tmp_path / "a", seed=1))
    try:
        alone = _greedy(vllm_server, "policy", max_tokens=64, ignore_eos=True)
        adapter_b = random_lora(tmp_path / "b", seed=2)
        ended: list[float] = []
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(_greedy, vllm_server, "policy", 64, True)
            running.add_done_callback(lambda _: ended.append(time.monotonic()))
            time.sleep(0.3)  # 64 tokens take seconds on CPU: the request is decoding when the push starts
            push_started = time.monotonic()
            sync.load_lora("policy", adapter_b, inplace=True, pause=True)
            assert running.result()[0] == alone[0]  # every token sampled on adapter a
        assert ended[0] > push_started  # it was running when the push began
        assert not sync.is_paused()
        assert _greedy(vllm_server, "policy")[0] != alone[0][:6]  # later requests get adapter b
    finally:
        sync.unload_lora("policy")


def test_full_reload_changes_outputs_and_restores(vllm_server: Any, sync: WeightSyncClient,
                                                  default_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    if Path(getattr(vllm_server, "model_path", "") or "").resolve() != default_model_dir.resolve():
        pytest.skip("full reload test perturbs the default model's weights only")
    original = _greedy(vllm_server)
    version_before = sync.weight_version()
    state = load_file(str(default_model_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in state.items()}
    save_weights(perturbed, tmp_path / "step-1")
    try:
        timing = sync.reload_weights(tmp_path / "step-1", version="test-step-1")
        assert set(timing.steps_s) == {"pause", "reload_weights", "reset_prefix_cache", "resume",
                                       "update_weight_version"}
        assert sync.weight_version() == "test-step-1" and not sync.is_paused()
        changed = _greedy(vllm_server)
        assert changed[1] != original[1]
    finally:
        sync.reload_weights(default_model_dir, version=version_before or "base")
    restored = _greedy(vllm_server)
    assert restored[0] == original[0]
    assert restored[1] == pytest.approx(original[1], abs=1e-4)
