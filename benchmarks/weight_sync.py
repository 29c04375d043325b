"""Measure the cost of pushing new weights into a running vLLM server (no restart).

Methods, each repeated ``--reps`` times (median reported, plus min/max):
* ``lora_load_inplace``: ``POST /v1/load_lora_adapter`` with ``load_inplace`` (rank-8 q/v adapter);
* ``full_reload``: ``/pause?mode=wait`` + ``/collective_rpc reload_weights`` + ``/reset_prefix_cache``
  + ``/resume`` + ``/update_weight_version`` (per-step medians too);
* ``full_reload_nopause``: the same without pause/resume (in-flight requests would mix weights);
* ``restart`` (only with ``--restart``): stop + start of the whole server, the cost both avoid.
It also reports server start time, RSS, and greedy decode speed for the base model and with an
adapter (LoRA decoding is slower on CPU). Left out: NCCL/CUDA-IPC transfer (GPU only).

Run: ``.venv/bin/python benchmarks/weight_sync.py --reps 5 [--restart] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from spanlab.engine.config import EngineConfig
from spanlab.engine.server import VLLMServer
from spanlab.engine.weights import WeightSyncClient, save_weights, write_peft_lora

logger = logging.getLogger("benchmarks.weight_sync")
PROMPT = "<|im_start|>user\nWrite a short story about a robot.<|im_end|>\n<|im_start|>assistant\n"


def random_lora(out_dir: Path, seed: int, rank: int = 8) -> Path:
    """Rank-8 q/v adapter for SmolLM2-135M (30 layers, hidden 576, kv dim 192)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(30):
        for proj, out_dim in (("q_proj", 576), ("v_proj", 192)):
            p = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            weights[f"{p}.lora_A.weight"] = torch.randn(rank, 576, generator=gen) * 0.05
            weights[f"{p}.lora_B.weight"] = torch.randn(out_dim, rank, generator=gen) * 0.05
    return write_peft_lora(out_dir, weights, rank=rank, alpha=2 * rank, target_modules=["q_proj", "v_proj"])


def decode_tok_s(server: VLLMServer, model: str, max_tokens: int = 64, reps: int = 3) -> float:
    """Greedy single-request decode speed (generated tokens / wall second), median of ``reps``."""
    speeds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        resp = httpx.post(f"{server.base_url}/completions", timeout=300, json={
            "model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True})
        resp.raise_for_status()
        speeds.append(resp.json()["usage"]["completion_tokens"] / (time.perf_counter() - t0))
    return statistics.median(speeds)


def summarize(samples: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples), "n": len(samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--restart", action="store_true", help="also time a full server restart")
    ap.add_argument("--json", type=Path, help="write results here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    results: dict[str, Any] = {}
    config = EngineConfig(enable_lora=True, dev_routes=True, kv_cache_gib=1)
    with VLLMServer(config) as server, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        results["server"] = {"startup_s": server.startup_s, "rss_gb": server.rss_bytes() / 1e9}
        sync = WeightSyncClient(server.root_url)
        assert server.model_path is not None
        model_dir = Path(server.model_path)

        adapters = [random_lora(tmp / f"lora{i}", seed=i) for i in range(2)]
        sync.load_lora("bench", adapters[0], inplace=True)
        lora = [sync.load_lora("bench", adapters[(i + 1) % 2], inplace=True).total_s for i in range(args.reps)]
        results["lora_load_inplace"] = summarize(lora)
        results["decode_tok_s"] = {"base": decode_tok_s(server, server.model), "lora": decode_tok_s(server, "bench")}
        sync.unload_lora("bench")

        from safetensors.torch import load_file

        save_weights(load_file(str(model_dir / "model.safetensors")), tmp / "ckpt")  # a trainer's checkpoint
        full, steps = [], []
        for i in range(args.reps):
            timing = sync.reload_weights(tmp / "ckpt", version=f"bench-{i}")
            full.append(timing.total_s)
            steps.append(timing.steps_s)
        results["full_reload"] = summarize(full)
        results["full_reload"]["steps_median_s"] = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
        nopause = [sync.reload_weights(tmp / "ckpt", pause=False).total_s for _ in range(args.reps)]
        results["full_reload_nopause"] = summarize(nopause)
        sync.reload_weights(model_dir, version="base")
        if args.restart:
            t0 = time.perf_counter()
            server.restart()
            results["restart"] = summarize([time.perf_counter() - t0])
        sync.close()

    print(f"{'method':<22}{'median s':>10}{'min s':>9}{'max s':>9}{'n':>4}")
    for key in ("lora_load_inplace", "full_reload", "full_reload_nopause", "restart"):
        if key in results:
            r = results[key]
            print(f"{key:<22}{r['median_s']:>10.3f}{r['min_s']:>9.3f}{r['max_s']:>9.3f}{r['n']:>4}")
    steps = {k: round(v, 3) for k, v in results["full_reload"]["steps_median_s"].items()}
    print("full_reload steps (median s):", json.dumps(steps))
    srv, dec = results["server"], results["decode_tok_s"]
    print(f"server start {srv['startup_s']:.1f}s, RSS {srv['rss_gb']:.2f} GB; "
          f"greedy decode {dec['base']:.1f} tok/s base, {dec['lora']:.1f} tok/s with LoRA")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
