"""Side by side: one GRPO update step, TRL's GRPOTrainer vs spanlab's ``grpo_step`` (issue #10).

The same work for both: the same tiny random Llama (built in memory, fp32, seed 0), the same --samples sequences
(4 tasks x 4 samples, random token IDs, ~--prompt prompt + ~--response sampled tokens, lengths jittered +-10%,
0/1 rewards with signal in every group; ``benchmarks/grpo_step.py``'s ``make_samples``), the same update: full
fine-tuning with AdamW (lr 1e-5, no weight decay), no KL, clipped surrogate with clip 0.2 below / 0.28 above,
token-mean aggregation over the batch, gradient-norm clip 1.0, one update per batch (so the "old" log-probs
are the current ones, detached, on both sides), no engine importance-sampling correction. Mapped onto TRL 1.15:
``GRPOConfig(loss_type="dapo", beta=0, epsilon=0.2, epsilon_high=0.28, num_iterations=1)``; onto spanlab:
``GRPOConfig(clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_beta=0, tis_cap=None)``.

Only the update is timed, not generation. TRL: a real ``GRPOTrainer`` (dummy reward function and dataset; it
never generates here) whose ``_prepare_inputs`` is bypassed so ``training_step`` gets a prepared batch
(prompt_ids/prompt_mask left-padded, completion_ids/completion_mask right-padded, advantages,
num_items_in_batch), then gradient clipping and ``optimizer.step()`` as its training loop does. spanlab:
``grpo_step`` on the samples (its time includes advantages and collation). TRL always computes per-token
entropies as well (for its metrics); spanlab computes logits only at sampled positions; those are the two
implementations' own choices and part of what is compared.

Each side runs in its own subprocess (peak RSS is its own: VmHWM), 1 torch thread, one warm-up step then
--steps timed steps; --reps subprocess pairs in alternating order. Tokens/s counts every non-padding token
the forward/backward runs on (prompt + response), the same count for both.

Run: .venv/bin/python benchmarks/vs_trl_grpo.py [--reps 3] [--steps 1] [--samples 16] [--prompt 300]
                                                [--response 40] [--shared-prefix 0] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

VOCAB = 49_152  # SmolLM2's vocabulary (its tokenizer is what TRL's trainer is handed; it never tokenizes here)


def build_model(args: argparse.Namespace):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 64, head_dim=64,
        tie_word_embeddings=True)).train()


def samples_for(args: argparse.Namespace, step: int) -> list:
    from grpo_step import make_samples  # benchmarks/grpo_step.py

    return make_samples(args.samples, args.prompt, args.response, seed=100 + step, shared=args.shared_prefix)


def rss_mb() -> float:
    from spanlab.training.model import peak_rss_mb

    return peak_rss_mb()


# --- spanlab ---------------------------------------------------------------------------------------------
def run_spanlab(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from spanlab.algos.grpo.update import GRPOConfig, grpo_step

    config = GRPOConfig(lr=1e-5, clip_low=0.2, clip_high=0.28, aggregation="token_mean", kl_beta=0.0, tis_cap=None,
                        max_grad_norm=1.0, weight_decay=0.0, micro_batch_tokens=args.micro_batch_tokens)
    model = build_model(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    rss_loaded = rss_mb()
    steps = []
    for step in range(args.steps + 1):
        samples = samples_for(args, step)
        m = grpo_step(model, optimizer, samples, config, pad_id=0)
        steps.append({"step_s": m["step_s"], "tokens": m["tokens"], "loss": m["loss"]})
    return {"rss_loaded_mb": rss_loaded, "steps": steps[1:]}


# --- TRL -------------------------------------------------------------------------------------------------
def trl_inputs(samples: list, pad_id: int) -> dict[str, Any]:
    """The batch dict GRPOTrainer._compute_loss reads, as its _generate_and_score_completions builds it."""
    import numpy as np
    import torch

    from spanlab.algos.grpo.update import group_advantages

    prompts = [s.input_ids[s.loss_mask == 0] for s in samples]
    completions = [s.input_ids[s.loss_mask == 1] for s in samples]
    P, C, B = max(map(len, prompts)), max(map(len, completions)), len(samples)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, C), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((B, C), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        prompt_ids[i, P - len(p):] = torch.from_numpy(p.astype(np.int64))  # left padding
        prompt_mask[i, P - len(p):] = 1
        completion_ids[i, :len(c)] = torch.from_numpy(c.astype(np.int64))  # right padding
        completion_mask[i, :len(c)] = 1
    adv = group_advantages([s.reward for s in samples], [s.group_id for s in samples])
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor(adv, dtype=torch.float32),
            "num_items_in_batch": completion_mask.sum().float()}


class _TorchLogProbs:
    """A plain-torch stand-in for TRL's fused LM-head kernel (``trl.kernels.ChunkedLogProbFunction``), which is a
    Triton kernel: on a machine without a GPU, GRPOTrainer's update fails in it ("0 active drivers"). Same inputs,
    same outputs (per-token log-probs of the targets and entropies, at the same completion positions); the
    logits of those positions are materialized at once (N x vocab, fp32), as spanlab does at its sampled ones."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=("entropy",)):
        import torch

        logits = hidden @ weight.t()
        if bias is not None:
            logits = logits + bias
        logits = logits.float() * logit_scale
        if final_logit_softcapping is not None:
            logits = torch.tanh(logits / final_logit_softcapping) * final_logit_softcapping
        logp = torch.log_softmax(logits / temperature, dim=-1)
        log_probs = logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1) if "entropy" in outputs else None
        return log_probs, entropy, None, None, None


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from spanlab.engine.model import ensure_default_model

    if not torch.cuda.is_available():
        import trl.trainer.utils as trl_utils

        trl_utils._ChunkedLogProbFunction = _TorchLogProbs
    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    assert len(tokenizer) <= VOCAB, len(tokenizer)
    model = build_model(args)
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, fp16=False, report_to=[], save_strategy="no",
            disable_tqdm=True, logging_steps=10_000, per_device_train_batch_size=args.samples, num_generations=4,
            gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
            max_completion_length=2 * args.response,
            loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.28, learning_rate=1e-5, weight_decay=0.0,
            max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
            seed=0, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                              args=cfg, train_dataset=Dataset.from_dict({"prompt": ["x"] * args.samples}),
                              processing_class=tokenizer)
        torch.set_num_threads(args.threads)  # the trainer's set-up may have changed it
        trainer.create_optimizer_and_scheduler(num_training_steps=args.steps + 1)
        trainer._prepare_inputs = lambda inputs: inputs  # the batch is prepared; GRPO would generate here
        trainer.current_gradient_accumulation_steps = 1  # what Trainer's training loop sets before each step
        model = trainer.model
        rss_loaded = rss_mb()
        steps = []
        for step in range(args.steps + 1):
            samples = samples_for(args, step)
            t0 = time.perf_counter()
            inputs = trl_inputs(samples, tokenizer.pad_token_id or 0)
            loss = trainer.training_step(model, inputs, inputs["num_items_in_batch"])
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
            model.zero_grad(set_to_none=True)
            steps.append({"step_s": time.perf_counter() - t0, "tokens": float(sum(len(s) for s in samples)),
                          "loss": float(loss)})
    return {"rss_loaded_mb": rss_loaded, "steps": steps[1:]}


# --- driver ----------------------------------------------------------------------------------------------
def child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    res = (run_trl if name == "trl" else run_spanlab)(args)
    return {"system": name, **res, "peak_rss_mb": rss_mb(),
            "params_m": sum(p.numel() for p in build_model(args).parameters()) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="subprocess pairs, alternating order")
    ap.add_argument("--steps", type=int, default=1, help="timed steps per subprocess (after one warm-up)")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--response", type=int, default=40)
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="prompt tokens all samples share (an agent's system prompt + tools); 0: none")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096, help="spanlab's micro-batch (its default)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("@@ " + json.dumps(child(args.child, args)), flush=True)
        return

    argv = sys.argv[1:]
    print(f"# {args.samples} samples x ~{args.prompt}+{args.response} tokens ({args.shared_prefix} shared), tiny "
          f"random Llama (hidden {args.hidden}, {args.layers} layers, vocab {VOCAB}), fp32, {args.threads} torch "
          f"thread(s); per subprocess 1 warm-up + {args.steps} timed steps; {args.reps} reps alternating; load "
          f"average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {"trl": [], "spanlab": []}
    for rep in range(args.reps):
        for name in ("trl", "spanlab") if rep % 2 == 0 else ("spanlab", "trl"):
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
                   "PYTHONWARNINGS": "ignore"}
            proc = subprocess.run([sys.executable, __file__, *argv, "--child", name], capture_output=True, text=True,
                                  env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@ ")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            r = json.loads(lines[-1][3:])
            results[name].append(r)
            step_s = statistics.median(s["step_s"] for s in r["steps"])
            tokens = statistics.median(s["tokens"] for s in r["steps"])
            print(f"  rep {rep}: {name:8} step {step_s:6.2f} s  {tokens / step_s:7.0f} tok/s  RSS after load "
                  f"{r['rss_loaded_mb']:5.0f} MB  peak {r['peak_rss_mb']:5.0f} MB  losses "
                  f"{[round(s['loss'], 4) for s in r['steps']]}", flush=True)

    def summary(name: str) -> dict[str, float]:
        rs = results[name]
        return {
            "step_s": statistics.median(statistics.median(s["step_s"] for s in r["steps"]) for r in rs),
            "tok_s": statistics.median(statistics.median(s["tokens"] / s["step_s"] for s in r["steps"]) for r in rs),
            "tokens": rs[0]["steps"][0]["tokens"],
            "rss_loaded": statistics.median(r["rss_loaded_mb"] for r in rs),
            "peak": statistics.median(r["peak_rss_mb"] for r in rs),
        }

    s, t = summary("spanlab"), summary("trl")
    print(f"\n# medians of {args.reps} subprocesses (each the median of its {args.steps} steps); "
          f"{results['trl'][0]['params_m']:.1f} M parameters; load average now "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'system':8} {'step s':>7} {'tokens/s':>9} {'RSS after load':>15} {'peak RSS':>9}")
    for name, x in (("trl", t), ("spanlab", s)):
        print(f"{name:8} {x['step_s']:7.2f} {x['tok_s']:9.0f} {x['rss_loaded']:13.0f}MB {x['peak']:7.0f}MB")
    print(f"ratios spanlab / TRL: tokens/s {s['tok_s'] / t['tok_s']:.2f}x (goal >= 1.0), peak RSS "
          f"{s['peak'] / t['peak']:.2f}x (goal <= 1.0), peak RSS above the loaded model "
          f"{(s['peak'] - s['rss_loaded']) / max(t['peak'] - t['rss_loaded'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
