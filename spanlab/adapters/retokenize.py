"""Retokenized samples: what RL frameworks trained on before engines returned token IDs (issue #7).

Why: agents talk text, and a trainer that only has text must decode, re-apply a chat template and
re-tokenize. That gives other IDs than the policy sampled (non-canonical BPE splits, tool calls
re-serialized, a training-side template that differs from the serving one; REFERENCE.md §1), and the
error is not token-level, so importance sampling cannot repair it. spanlab stores the text of every call
(``request_messages``, ``request_tools``, ``response_message``) next to the exact IDs, so the old way can be
replayed on the same rollouts and the drift measured instead of argued about.

How a sample is rebuilt (``token_source="retokenized"``): from its last call's conversation (its messages
+ its response; for a TITO session that is the whole conversation) rendered by
:func:`~spanlab.adapters.conversation.encode_conversation` with the training-side tokenizer, optionally with another
chat template file to model an inference/training stack mismatch. Trained tokens: the last ``k`` assistant
turns of that render, ``k`` = the sampled turns of the exact sample (1 for a per-call triplet, every turn
of a TITO segment). A turn cut at ``max_tokens`` gets the template's end-of-turn token, as a text-only
trainer would (the engine never sampled it).

Engine logprobs: a text-only trainer had none, so ``engine_logprobs`` is NaN on trained tokens and TIS
weighs them 1 (``policy_loss``). For metrics only, ``aligned_logprobs`` gives each trained token that aligns
with a sampled token (difflib matching blocks over the two ID sequences: same ID, same order) that
token's engine logprob, NaN elsewhere. The exact sample rides along on ``Sample.exact``.

Left out: re-tokenizing per-call prompts separately from responses (the conversation is rendered once),
the engine's own detokenization settings (the stored ``response_message`` is used as the engine parsed it).
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Generator, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import jinja2
import numpy as np

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.samples import Sample
from spanlab.errors import ConfigError
from spanlab.store.base import StoreAPI

__all__ = ["Retokenizer", "TokenSource", "align_logprobs", "drift_stats", "retokenize_samples"]

logger = logging.getLogger(__name__)

TokenSource = Literal["exact", "retokenized"]
TOKEN_SOURCES: tuple[TokenSource, ...] = ("exact", "retokenized")

_TEXT_COLUMNS = ["span_id", "request_messages", "request_tools", "response_message"]


class _TemplatedTokenizer:
    """A tokenizer whose ``apply_chat_template`` uses another template: the training side of a stack mismatch."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self._tokenizer, self._template = tokenizer, template

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self._tokenizer.apply_chat_template(conversation, chat_template=self._template, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)


class Retokenizer:
    """Rebuilds exact samples from their stored text with a training-side tokenizer (and template file)."""

    def __init__(self, tokenizer: Any, chat_template: str | Path | None = None) -> None:
        if tokenizer is None:
            raise ConfigError("token_source 'retokenized' needs the training-side tokenizer")
        if chat_template is not None:
            path = Path(chat_template)
            if not path.is_file():
                raise ConfigError(f"retokenize template {str(path)!r} is not a file")
            tokenizer = _TemplatedTokenizer(tokenizer, path.read_text(encoding="utf-8"))
        self.tokenizer = tokenizer

    def rebuild(self, exact: Sample, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                response: dict[str, Any]) -> Sample:
        """The sample a text-only trainer would build for ``exact``'s conversation (see the module docstring)."""
        conv = encode_conversation(self.tokenizer, [*messages, response], tools)
        mask = _last_runs(conv.loss_mask, _n_runs(exact.loss_mask))
        end = int(np.flatnonzero(mask)[-1]) + 1 if mask.any() else 0  # the template's tail after the last turn
        ids, mask = conv.input_ids[:end], mask[:end]  # ("\n" after <|im_end|>) is never trained: drop it
        sampled = exact.loss_mask.astype(bool)
        aligned = align_logprobs(ids, mask, exact.input_ids[sampled], exact.engine_logprobs[sampled])
        engine = np.where(mask.astype(bool), np.float32(np.nan), np.float32(0.0)).astype(np.float32)
        return replace(exact, input_ids=ids, loss_mask=mask, engine_logprobs=engine, exact=exact,
                       aligned_logprobs=aligned)


def retokenize_samples(store: StoreAPI, samples: Iterable[Sample], retokenizer: Retokenizer,
                       chunk: int = 256) -> Iterator[Sample]:
    """Rebuild each exact sample from the text of its last call, reading the text in bulk per ``chunk``."""
    pending: list[Sample] = []
    n_failed = 0
    for sample in samples:
        pending.append(sample)
        if len(pending) >= chunk:
            n_failed += yield from _rebuild_chunk(store, pending, retokenizer)
            pending = []
    if pending:
        n_failed += yield from _rebuild_chunk(store, pending, retokenizer)
    if n_failed:
        logger.warning("retokenization skipped %d sample(s) (no stored text, or the template cannot render them)",
                       n_failed)


def _rebuild_chunk(store: StoreAPI, samples: list[Sample], retokenizer: Retokenizer) -> Generator[Sample, None, int]:
    """Yield the chunk's rebuilt samples; return how many could not be rebuilt."""
    tbl = store.spans_table(span_ids=[s.span_ids[-1] for s in samples], columns=_TEXT_COLUMNS)
    text = {sid: (m, t, r) for sid, m, t, r in zip(*(tbl[c].to_pylist() for c in _TEXT_COLUMNS), strict=True)}
    failed = 0
    for s in samples:
        messages, tools, response = text.get(s.span_ids[-1], (None, None, None))
        if messages is None or response is None:
            failed += 1
            continue
        try:
            yield retokenizer.rebuild(s, json.loads(messages), json.loads(tools) if tools else None,
                                      json.loads(response))
        except (ConfigError, jinja2.TemplateError) as exc:
            logger.debug("cannot retokenize span %s: %s", s.span_ids[-1], exc)
            failed += 1
    return failed


def align_logprobs(ids: np.ndarray, mask: np.ndarray, sampled_ids: np.ndarray,
                   sampled_logprobs: np.ndarray) -> np.ndarray:
    """``[T]`` float32: at each trained position (``mask`` 1) whose ID is matched to a sampled ID, that sampled
    token's engine logprob; NaN elsewhere. Matching: difflib's matching blocks of trained vs sampled IDs."""
    out = np.where(mask.astype(bool), np.float32(np.nan), np.float32(0.0)).astype(np.float32)
    positions = np.flatnonzero(mask)
    for a, b, n in _matching_blocks(ids[positions], sampled_ids):
        out[positions[a:a + n]] = sampled_logprobs[b:b + n]
    return out


def drift_stats(samples: Iterable[Sample]) -> dict[str, float]:
    """Per-batch drift between what is trained and what the engine sampled (all 0 for exact samples).

    ``drift_sample_frac``: samples whose trained token IDs (mask 1, in order) differ from the sampled ones;
    ``drift_sequence_frac``: samples whose whole sequence (context included) differs from the engine's;
    ``drift_token_frac``: trained and sampled tokens left unmatched by the alignment of the two ID
    sequences, over both counts (0: same tokens; 1: nothing in common).
    """
    n = differs = seq_differs = tokens = unmatched = 0
    for s in samples:
        n += 1
        trained_ids = s.input_ids[s.loss_mask.astype(bool)]
        if s.exact is None:
            tokens += 2 * len(trained_ids)
            continue
        ref, sampled_ids = s.exact, s.exact.input_ids[s.exact.loss_mask.astype(bool)]
        differs += not np.array_equal(trained_ids, sampled_ids)
        seq_differs += not np.array_equal(s.input_ids, ref.input_ids)
        matched = sum(size for _, _, size in _matching_blocks(trained_ids, sampled_ids))
        tokens += len(trained_ids) + len(sampled_ids)
        unmatched += len(trained_ids) + len(sampled_ids) - 2 * matched
    return {"drift_sample_frac": differs / n if n else 0.0, "drift_sequence_frac": seq_differs / n if n else 0.0,
            "drift_token_frac": unmatched / tokens if tokens else 0.0}


def _matching_blocks(a: np.ndarray, b: np.ndarray) -> list[tuple[int, int, int]]:
    """(i, j, size) of equal runs ``a[i:i+size] == b[j:j+size]``, in order (difflib, no junk heuristic)."""
    if np.array_equal(a, b):
        return [(0, 0, len(a))]
    matcher = difflib.SequenceMatcher(None, a.tolist(), b.tolist(), autojunk=False)
    return [(m.a, m.b, m.size) for m in matcher.get_matching_blocks() if m.size]


def _runs_of_ones(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of 1s."""
    padded = np.concatenate([[0], (np.asarray(mask) > 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _n_runs(mask: np.ndarray) -> int:
    return len(_runs_of_ones(mask))


def _last_runs(mask: np.ndarray, k: int) -> np.ndarray:
    """``mask`` with only its last ``k`` runs of 1s kept (the last ``k`` assistant turns)."""
    out = np.zeros_like(mask, dtype=np.uint8)
    for start, end in _runs_of_ones(mask)[-k:] if k > 0 else []:
        out[start:end] = 1
    return out
