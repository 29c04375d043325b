"""Trainer speed and memory of one GRPO update step (issue #6): tokens/s and peak RSS per step.

Realistic shapes for an agent call: --samples sequences (4 tasks x 4 samples) of ~--prompt prompt tokens
plus ~--response sampled tokens (lengths jittered +-10%), random token IDs, 0/1 rewards with signal in
every group, engine logprobs present (TIS on). Full fine-tuning in fp32 with AdamW, the default
``GRPOConfig`` otherwise. Each model runs in its own subprocess so its peak RSS is its own. Tokens/s
counts every non-padding token the forward/backward pass runs on (prompt + response); "loss tok/s" only
the sampled ones. Not a test: the machine is shared and noisy; medians over --steps after one warm-up.

Run: .venv/bin/python benchmarks/grpo_step.py [--models tiny default] [--threads 1] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.update import GRPOConfig, grpo_step, make_model_for_training
from spanlab.training.model import peak_rss_mb

VOCAB = 49_152


def load(name: str, config: GRPOConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    if name == "default":
        from spanlab.engine.model import ensure_default_model

        return make_model_for_training(ensure_default_model(), config)
    from transformers import LlamaConfig, LlamaForCausalLM  # tests/tiny_model.py's shape, built in memory

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         head_dim=64, tie_word_embeddings=True)).train()
    return model, torch.optim.AdamW(model.parameters(), lr=config.lr)


def make_samples(n: int, prompt: int, response: int, seed: int, shared: int = 0) -> list[Sample]:
    """Random samples; the first ``shared`` prompt tokens are the same in all (an agent's system + tools)."""
    rng = np.random.default_rng(seed)
    common = rng.integers(0, VOCAB, shared, dtype=np.int32)
    samples = []
    for i in range(n):
        p = int(prompt * rng.uniform(0.9, 1.1))
        r = int(response * rng.uniform(0.9, 1.1))
        mask = np.r_[np.zeros(p, np.uint8), np.ones(r, np.uint8)]
        engine = np.where(mask == 1, -rng.random(p + r) * 3, 0).astype(np.float32)
        ids = np.r_[common, rng.integers(0, VOCAB, p + r - shared, dtype=np.int32)].astype(np.int32)
        samples.append(Sample(f"r{i}", f"g{i // 4}", ids, mask, engine, reward=float(i % 4 in (0, 3))))
    return samples


def run_one(name: str, args: argparse.Namespace) -> dict[str, float | str]:
    torch.set_num_threads(args.threads)
    config = GRPOConfig(micro_batch_tokens=args.micro_batch_tokens)
    t0 = time.perf_counter()
    model, optimizer = load(name, config)
    load_s, rss_loaded = time.perf_counter() - t0, peak_rss_mb()
    runs = [grpo_step(model, optimizer, make_samples(args.samples, args.prompt, args.response, seed=s,
                                                     shared=args.shared_prefix), config, pad_id=0)
            for s in range(args.steps + 1)][1:]
    return {
        "model": name,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "threads": args.threads,
        "load_s": load_s,
        "tokens_per_step": statistics.median(m["tokens"] for m in runs),
        "step_s": statistics.median(m["step_s"] for m in runs),
        "tokens_per_s": statistics.median(m["tokens_per_s"] for m in runs),
        "loss_tokens_per_s": statistics.median(m["loss_tokens"] / m["step_s"] for m in runs),
        "rss_after_load_mb": rss_loaded,
        "peak_rss_mb": max(m["peak_rss_mb"] for m in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "default"], choices=["tiny", "default"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--response", type=int, default=40)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--shared-prefix", type=int, default=230,
                        help="prompt tokens all samples share (the calc agent's system + tools: ~230); 0: none")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args)))
        return
    print(f"{args.samples} samples x ~{args.prompt}+{args.response} tokens ({args.shared_prefix} shared), "
          f"{args.threads} torch thread(s), "
          f"median of {args.steps} steps after 1 warm-up")
    print(f"{'model':8} {'params':>8} {'tok/step':>9} {'step s':>7} {'tok/s':>7} {'loss tok/s':>10} "
          f"{'RSS loaded':>11} {'peak RSS':>9}")
    for name in args.models:
        argv = [a for a in sys.argv[1:] if a != "--models" and a not in ("tiny", "default")]
        out = subprocess.run([sys.executable, __file__, *argv, "--child", name], check=True, capture_output=True,
                             text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{r['model']:8} {r['params_m']:7.1f}M {r['tokens_per_step']:9.0f} {r['step_s']:7.2f} "
              f"{r['tokens_per_s']:7.0f} {r['loss_tokens_per_s']:10.0f} {r['rss_after_load_mb']:9.0f}MB "
              f"{r['peak_rss_mb']:7.0f}MB")


if __name__ == "__main__":
    main()
