"""Measure retokenization drift offline on a store: no training, the same statistics as the training runs.

For the rollouts of a store (train rollouts by default, or one evaluation phase), builds the samples three
ways — exact engine IDs, re-tokenized with the tokenizer's own template, re-tokenized with the variant
template (``chatml_tools_variant.jinja``) — and prints, per way, the drift fractions of
``spanlab.adapters.retokenize.drift_stats``. With ``--weights DIR`` (the policy that sampled those
rollouts, e.g. a run's final weights with ``--phase final``), also the mean |logp_trainer - logp_engine|
over trained tokens aligned with a sampled token, all three ways under the same weights: the off-policy
gap each way of building samples starts a GRPO step with.

Run from the repo root (this is how to check your own agent's spans before training on text):

    .venv/bin/python tutorials/drift/replay.py runs/drift-exact.duckdb
    .venv/bin/python tutorials/drift/replay.py runs/drift-exact.duckdb --phase final --weights runs/drift-exact/weights

Left out: the engine's sampling temperature (logprobs are compared at temperature 1, as vLLM reports raw ones).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WAYS: tuple[tuple[str, str, Path | None], ...] = (
    ("exact", "exact", None),
    ("retokenized", "retokenized", None),
    ("retokenized + variant template", "retokenized", HERE / "chatml_tools_variant.jinja"),
)


def rollout_ids(store: Any, phase: str | None) -> list[str]:
    """Train rollouts, or the held-out rollouts of one evaluation phase (``metadata.phase``)."""
    if phase is None:
        sql, params = "SELECT rollout_id FROM rollouts WHERE mode = 'train'", []
    else:
        sql, params = "SELECT rollout_id FROM rollouts WHERE mode = 'test' AND metadata->>'$.phase' = ?", [phase]
    return store.query(sql, params).column("rollout_id").to_pylist()


def logp_gap(model: Any, samples: list[Any], pad_id: int, max_tokens: int = 2048) -> tuple[float, int]:
    """Mean |trainer - engine| logprob over aligned trained tokens, and how many tokens it is over."""
    import torch

    from spanlab.adapters.samples import collate, micro_batches
    from spanlab.training.logprobs import token_logprobs

    total, count = 0.0, 0
    ordered = sorted(samples, key=len)
    with torch.no_grad():
        for chunk in micro_batches(ordered, max_tokens):
            b = collate(chunk, [0.0] * len(chunk), pad_id)
            logp_B_T = token_logprobs(model, b.input_ids, b.attention_mask, positions_mask=b.loss_mask > 0)
            assert b.sampled_logprobs is not None
            known_B_T = (b.loss_mask > 0) & torch.isfinite(b.sampled_logprobs)
            diff_N = (logp_B_T - b.sampled_logprobs)[known_B_T].abs()
            total, count = total + float(diff_N.sum()), count + int(diff_N.numel())
    return (total / count if count else math.nan), count


def load_weights(weights: Path) -> Any:
    """The default model with a run's pushed weights (``spanlab train`` writes only ``model.safetensors``)."""
    from safetensors.torch import load_file

    from spanlab.engine.model import ensure_default_model
    from spanlab.training.policy import load_policy

    model, _ = load_policy(ensure_default_model())
    missing, unexpected = model.load_state_dict(load_file(str(weights / "model.safetensors")), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the embeddings, saved once
        raise SystemExit(f"{weights}: weights do not fit the default model ({missing[:3]}, {unexpected[:3]})")
    model.tie_weights()
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--phase", default=None, help="an evaluation phase (base, warm_start, final); default: train")
    parser.add_argument("--weights", type=Path, default=None, help="the policy that sampled these rollouts")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from spanlab.adapters.retokenize import drift_stats
    from spanlab.adapters.sample_reader import iter_samples
    from spanlab.engine.model import ensure_default_model
    from spanlab.store import SpanStore
    from spanlab.training.policy import pad_token_id

    model = load_weights(args.weights) if args.weights else None
    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model())
    with SpanStore(args.db) as store:
        ids = rollout_ids(store, args.phase)
        print(f"{args.db}: {len(ids)} {args.phase or 'train'} rollouts")
        for label, source, template in WAYS:
            samples = list(iter_samples(store, ids, token_source=source, tokenizer=tokenizer,  # type: ignore[arg-type]
                                        chat_template=template))
            stats = {k: round(v, 4) for k, v in drift_stats(samples).items()}
            line = f"  {label:32s} samples {len(samples):4d}  {stats}"
            if model is not None:
                gap, n = logp_gap(model, samples, pad_token_id(tokenizer))
                line += f"  mean |dlogp| {gap:.4f} over {n} tokens"
            print(line)


if __name__ == "__main__":
    main()
