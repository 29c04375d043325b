"""Side by side: one GRPO update step, TRL's GRPOTrainer vs spanlab's ``grpo_step``, on the same work (issue #43).

The same work for both: the same tiny random Llama (built in memory, fp32 on both sides, seed 0), the same batch of
--samples sequences (4 tasks x 4 samples, random token IDs, ~--prompt prompt + ~--response sampled tokens, lengths
jittered +-10%, 0/1 rewards with signal in every group; ``benchmarks/grpo_step.py``'s ``make_samples``; with
--group-prompts the 4 samples of a task share its prompt, as GRPO's samples of one prompt do) run as one
forward/backward on both sides (TRL: one padded batch; spanlab: one packed micro-batch, --micro-batch-tokens
large enough), the same update: full fine-tuning with AdamW (lr 1e-5, no weight decay), no KL, clipped surrogate
with clip 0.2 below / 0.28 above, token-mean aggregation over the batch, gradient-norm clip 1.0, one update per
batch (the "old" log-probs are the current ones, detached, on both sides), no engine importance-sampling
correction, and no entropy on either side. Mapped onto TRL 1.15: ``GRPOConfig(loss_type="dapo", beta=0,
epsilon=0.2, epsilon_high=0.28, num_iterations=1)``; onto spanlab: ``GRPOConfig(clip_low=0.2, clip_high=0.28,
aggregation="token_mean", kl_beta=0, tis_cap=None)``.

Only the update is timed, not generation. TRL: a real ``GRPOTrainer`` (dummy reward function and dataset; it
never generates here) whose ``_prepare_inputs`` is bypassed so ``training_step`` gets a prepared batch
(prompt_ids/prompt_mask left-padded, completion_ids/completion_mask right-padded, advantages,
num_items_in_batch), then gradient clipping and ``optimizer.step()`` as its training loop does. Its fused LM head
(``trl.kernels.ChunkedLogProbFunction``) is a Triton kernel that needs a GPU; on a CPU it is replaced by
:class:`_TorchChunkedLogProbs`, a plain-torch port of the same algorithm (4,096-position x 32,768-vocabulary
tiles, online log-sum-exp, tiles recomputed in the backward), asked for log-probs only: its entropy output is
zeros, so neither side computes entropy. spanlab: ``grpo_step`` on the samples (its time includes advantages,
collation and packing).

Each side runs in its own subprocess (peak RSS is its own: VmHWM), 1 torch thread, one warm-up step then
--steps timed steps; --reps subprocess pairs in alternating order (A B, B A, ...); the ratio is the median of the
reps' ratios. On a loaded machine wall time swings several-fold between processes; the CPU seconds of
the step (``time.process_time``) are printed beside it and are the steadier figure. Tokens/s counts every
non-padding token of the batch (prompt + response), the same count for both, whatever each side runs on.

Run: .venv/bin/python benchmarks/vs_trl_grpo.py [--reps 3] [--steps 1] [--samples 16] [--prompt 300]
                                                [--response 40] [--group-prompts] [--hidden 256] [--layers 4]
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

import torch

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
    """The step's batch; with --group-prompts each sample takes its group's first prompt (responses unchanged)."""
    import numpy as np
    from grpo_step import make_samples  # benchmarks/grpo_step.py

    samples = make_samples(args.samples, args.prompt, args.response, seed=100 + step, shared=args.shared_prefix)
    if args.group_prompts:
        for i, s in enumerate(samples):
            lead = samples[i - i % 4]
            prompt, response = lead.input_ids[lead.loss_mask == 0], s.input_ids[s.loss_mask == 1]
            engine = s.engine_logprobs[s.loss_mask == 1]
            s.input_ids = np.r_[prompt, response].astype(np.int32)
            s.loss_mask = np.r_[np.zeros(len(prompt), np.uint8), np.ones(len(response), np.uint8)]
            s.engine_logprobs = np.r_[np.zeros(len(prompt), np.float32), engine].astype(np.float32)
    return samples


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
        c0 = time.process_time()
        m = grpo_step(model, optimizer, samples, config, pad_id=0)
        steps.append({"step_s": m["step_s"], "cpu_s": time.process_time() - c0, "tokens": m["tokens"],
                      "loss": m["loss"]})
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


class _TorchChunkedLogProbs(torch.autograd.Function):
    """A plain-torch port of TRL's fused LM head (``trl.kernels.ChunkedLogProbFunction``, a Triton kernel: on a
    machine without a GPU, GRPOTrainer's update fails in it with "0 active drivers"). The same algorithm: tiles of
    4,096 positions x ``chunk_size`` (TRL passes 32,768) vocabulary entries, folded into an online log-sum-exp in
    the forward, recomputed in the backward and turned into the logits' gradient there; fp32 accumulation.
    Log-probs only: the entropy it returns is zeros (spanlab computes none either)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
                logit_scale=1.0, outputs=("entropy",)):
        if final_logit_softcapping is not None or logit_scale != 1.0:
            raise NotImplementedError("the CPU port covers plain LM heads only")
        ctx.set_materialize_grads(False)
        n_pos, vocab = hidden.shape[0], weight.shape[0]
        running_max = torch.full((n_pos,), float("-inf"))
        sum_exp = torch.zeros(n_pos)
        target_logit = torch.zeros(n_pos)
        for t0 in range(0, n_pos, _TOKEN_CHUNK):
            h = hidden[t0:t0 + _TOKEN_CHUNK]
            for v0 in range(0, vocab, chunk_size):
                tile = _tile(h, weight, bias, v0, chunk_size, temperature)
                m_old = running_max[t0:t0 + _TOKEN_CHUNK]
                m_new = torch.maximum(m_old, tile.max(1).values)
                sum_exp[t0:t0 + _TOKEN_CHUNK] = (sum_exp[t0:t0 + _TOKEN_CHUNK] * torch.exp(m_old - m_new)
                                                 + torch.exp(tile - m_new[:, None]).sum(1))
                running_max[t0:t0 + _TOKEN_CHUNK] = m_new
                local = targets[t0:t0 + _TOKEN_CHUNK] - v0
                inside = (local >= 0) & (local < tile.shape[1])
                picked = tile.gather(1, local.clamp(0, tile.shape[1] - 1)[:, None])[:, 0]
                target_logit[t0:t0 + _TOKEN_CHUNK] += torch.where(inside, picked, 0.0)
        log_z = running_max + torch.log(sum_exp)
        ctx.save_for_backward(hidden, weight, bias, targets, log_z)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return target_logit - log_z, torch.zeros(n_pos), None, None, None

    @staticmethod
    def backward(ctx, grad_logprobs, *_):
        hidden, weight, bias, targets, log_z = ctx.saved_tensors
        grad_hidden, grad_weight = torch.zeros_like(hidden), torch.zeros_like(weight)
        grad_bias = torch.zeros_like(bias) if bias is not None else None
        if grad_logprobs is None:
            return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None
        for t0 in range(0, hidden.shape[0], _TOKEN_CHUNK):
            h, g = hidden[t0:t0 + _TOKEN_CHUNK], grad_logprobs[t0:t0 + _TOKEN_CHUNK].float()
            for v0 in range(0, weight.shape[0], ctx.chunk_size):
                tile = _tile(h, weight, bias, v0, ctx.chunk_size, ctx.temperature)
                tile = tile.sub_(log_z[t0:t0 + _TOKEN_CHUNK, None]).exp_().mul_(-g[:, None])
                local = targets[t0:t0 + _TOKEN_CHUNK] - v0
                inside = (local >= 0) & (local < tile.shape[1])
                tile.scatter_add_(1, local.clamp(0, tile.shape[1] - 1)[:, None], torch.where(inside, g, 0.0)[:, None])
                tile.div_(ctx.temperature)
                w = weight[v0:v0 + ctx.chunk_size]
                grad_hidden[t0:t0 + _TOKEN_CHUNK].addmm_(tile, w)
                grad_weight[v0:v0 + ctx.chunk_size].addmm_(tile.t(), h)
                if grad_bias is not None:
                    grad_bias[v0:v0 + ctx.chunk_size] += tile.sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


_TOKEN_CHUNK = 4096  # TRL's TOKEN_CHUNK_SIZE


def _tile(h, weight, bias, v0, chunk_size, temperature):
    tile = h @ weight[v0:v0 + chunk_size].t()
    if bias is not None:
        tile = tile + bias[v0:v0 + chunk_size]
    return tile.float() / temperature


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from spanlab.engine.model import ensure_default_model

    if not torch.cuda.is_available():
        import trl.trainer.utils as trl_utils

        trl_utils._ChunkedLogProbFunction = _TorchChunkedLogProbs
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
            t0, c0 = time.perf_counter(), time.process_time()
            inputs = trl_inputs(samples, tokenizer.pad_token_id or 0)
            loss = trainer.training_step(model, inputs, inputs["num_items_in_batch"])
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
            model.zero_grad(set_to_none=True)
            steps.append({"step_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                          "tokens": float(sum(len(s) for s in samples)),
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
    ap.add_argument("--group-prompts", action="store_true",
                    help="the 4 samples of a task share its prompt (GRPO's samples of one prompt)")
    ap.add_argument("--micro-batch-tokens", type=int, default=1 << 20,
                    help="spanlab's micro-batch, packed tokens; the default holds the whole batch, as TRL's one batch")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("@@ " + json.dumps(child(args.child, args)), flush=True)
        return

    argv = sys.argv[1:]
    print(f"# {args.samples} samples x ~{args.prompt}+{args.response} tokens ({args.shared_prefix} shared by all, "
          f"prompts {'shared by each group' if args.group_prompts else 'distinct'}), tiny "
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
            cpu_s = statistics.median(s["cpu_s"] for s in r["steps"])
            print(f"  rep {rep}: {name:8} step {step_s:6.2f} s ({cpu_s:5.2f} CPU s)  {tokens / step_s:7.0f} tok/s "
                  f"({tokens / cpu_s:5.0f} per CPU s)  RSS after load "
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
    tok_ratios = [statistics.median(sp["tokens"] / sp["step_s"] for sp in a["steps"])
                  / statistics.median(tr["tokens"] / tr["step_s"] for tr in b["steps"])
                  for a, b in zip(results["spanlab"], results["trl"], strict=True)]
    cpu_ratios = [statistics.median(tr["cpu_s"] for tr in b["steps"])
                  / statistics.median(sp["cpu_s"] for sp in a["steps"])
                  for a, b in zip(results["spanlab"], results["trl"], strict=True)]
    rss_ratios = [a["peak_rss_mb"] / b["peak_rss_mb"] for a, b in zip(results["spanlab"], results["trl"], strict=True)]
    print(f"ratios spanlab / TRL, median of the {args.reps} reps (each rep: one TRL and one spanlab subprocess side by "
          f"side): tokens/s {statistics.median(tok_ratios):.2f}x (goal >= 1.5x; per rep "
          f"{', '.join(f'{r:.2f}' for r in tok_ratios)}), tokens per CPU second "
          f"{statistics.median(cpu_ratios):.2f}x (per rep {', '.join(f'{r:.2f}' for r in cpu_ratios)}), peak RSS "
          f"{statistics.median(rss_ratios):.2f}x (goal <= 0.67x; per rep {', '.join(f'{r:.2f}' for r in rss_ratios)}), "
          f"peak RSS above the loaded model "
          f"{(s['peak'] - s['rss_loaded']) / max(t['peak'] - t['rss_loaded'], 1e-9):.2f}x")

if __name__ == "__main__":
    main()
