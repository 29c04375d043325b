"""Demonstrations as spans: the exact token IDs a trainer sees in SFT, stored next to the rollouts' calls.

A generated demonstration (question -> tool call -> result -> answer) never passed through the engine, so the
gateway never recorded it. Stored as a ``demonstration`` span (the encoded conversation, with the mask that
says which tokens are trained), every token a run trained on can be queried in one place, the warm start's as
well as RL's, and the trainers read them back through this adapter: the store feeds both terms of an update
that mixes RL with demonstrations (InstructGPT's PPO-ptx).

A span holds one conversation: ``prompt_token_ids`` up to the first trained token, ``response_token_ids`` the
rest, and ``loss_mask`` over both (tool results inside the response are 0). ``attributes`` say where it came
from: ``source`` (``warm_start``, ``grpo.demonstrations``, ...), ``run_id``, ``task_id``, ``level``, and for a
role's mined demonstration (:mod:`spanlab.adapters.role_demos`) its ``role`` and ``label`` (e.g. ``OK``, ``WRONG``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from spanlab.adapters.conversation import sft_sample
from spanlab.adapters.samples import Sample
from spanlab.store.base import StoreAPI
from spanlab.types import LLMCall, Span

__all__ = ["demonstration_span", "read_demonstrations", "record_demonstrations"]

_COLUMNS = ("span_id", "attributes", "prompt_token_ids", "response_token_ids", "loss_mask")


def demonstration_span(sample: Sample, *, model: str, source: str, run_id: str, index: int = 0,
                       task: dict[str, Any] | None = None, messages: list[dict[str, Any]] | None = None,
                       extra: dict[str, Any] | None = None) -> Span:
    """One encoded conversation (``input_ids`` + ``loss_mask``) as a ``demonstration`` span; ``index``: its place
    in the set it belongs to (the order a trainer reads them back in); ``extra``: more attributes (role, label)."""
    ids, mask = np.asarray(sample.input_ids, dtype=np.int32), np.asarray(sample.loss_mask, dtype=np.uint8)
    trained = np.flatnonzero(mask)
    cut = int(trained[0]) if len(trained) else len(ids)
    task = task or {}
    attributes = {"source": source, "run_id": run_id, "index": index,
                  **{k: task[k] for k in ("task_id", "level") if task.get(k) is not None}, **(extra or {})}
    return Span(name="demonstration", kind="demonstration", attributes=attributes,
                llm=LLMCall(model=model, request_messages=messages or [], prompt_token_ids=ids[:cut],
                            response_token_ids=ids[cut:], loss_mask=mask))


def record_demonstrations(store: StoreAPI, samples: Sequence[Sample], tasks: Sequence[dict[str, Any]], *, model: str,
                          source: str, run_id: str, conversations: Sequence[list[dict[str, Any]]] | None = None,
                          extras: Sequence[dict[str, Any]] | None = None) -> list[str]:
    """Store one ``demonstration`` span per sample (its task beside it); returns the span IDs, in order."""
    spans = [demonstration_span(s, model=model, source=source, run_id=run_id, index=i, task=t,
                                messages=conversations[i] if conversations is not None else None,
                                extra=extras[i] if extras is not None else None)
             for i, (s, t) in enumerate(zip(samples, tasks, strict=True))]
    store.add_spans(spans)
    return [s.span_id for s in spans]


def read_demonstrations(store: StoreAPI, *, run_id: str, sources: Sequence[str] | None = None) -> list[Sample]:
    """The run's stored demonstrations (of ``sources``, or all) as trainer rows, in the order they were stored.

    Works the same on every store kind (it reads through ``spans_reader``); the token IDs and mask come back
    exactly as they were stored."""
    found: list[tuple[float, int, Sample]] = []
    reader = store.spans_reader(kinds=["demonstration"], columns=[*_COLUMNS, "start_time"])
    for batch in reader:
        for row in batch.to_pylist():
            attrs = json.loads(row["attributes"]) if row["attributes"] else {}  # a JSON column, as every read gives it
            if attrs.get("run_id") != run_id or (sources is not None and attrs.get("source") not in sources):
                continue
            ids = np.asarray(list(row["prompt_token_ids"] or []) + list(row["response_token_ids"] or []),
                             dtype=np.int32)
            sample = sft_sample(ids, np.asarray(row["loss_mask"], dtype=np.uint8))
            sample.span_ids = [row["span_id"]]
            found.append((row["start_time"], int(attrs.get("index", len(found))), sample))
    return [s for _, _, s in sorted(found, key=lambda x: (x[0], x[1]))]

