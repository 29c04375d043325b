"""Drift report: where re-tokenizing recorded text would give other token IDs than the model really used.

Why: RL trains on the IDs the policy sampled; a trainer that rebuilds them from text (or a per-call
recorder whose next prompt is the engine's re-render) silently trains on other IDs (REFERENCE §1). This
report measures it on recorded spans, per cause:

* ``response`` check, per call: decode the sampled IDs and encode the text again; different IDs mean the
  model sampled a non-canonical BPE split (``H``+``AVING`` where the tokenizer writes ``HAV``+``ING``).
* ``next_prompt`` check, per pair of consecutive calls of an attempt where the second extends the first:
  the session buffer (first prompt + sampled IDs + stop gap + delta; TITO spans carry their loss mask, so
  earlier sampled turns are known) against the engine's render of the second call (its recorded prompt
  when recorded per call; the template's render when the call was served by TITO). Each differing sampled
  turn gets a cause: ``non_canonical_bpe`` (same text, other IDs), ``tool_call_reserialization`` (a turn
  with ``<tool_call>`` whose text the template writes differently, e.g. JSON spacing), ``template`` (any
  other text difference, or prompt tokens that are not where the buffer has them).

Pairs whose second call does not extend the first (history rewritten) are counted, not compared.
The report takes the calls given to it (:class:`RecordedCall`, or an Arrow table through :func:`recorded_calls`);
no storage here: :func:`spanlab.adapters.recorded_calls.load_calls` reads them from a store file.
Run: ``spanlab drift [--db PATH] [--json] [--plot FILE.png] [--tokenizer DIR]``; API: :func:`drift_report`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from spanlab.errors import SpanlabError
from spanlab.tito.buffer import SessionBuffer, walk_render
from spanlab.tito.messages import engine_form
from spanlab.tito.prefix import first_mismatch
from spanlab.tito.readiness import close_ids
from spanlab.tito.render import render_ids
from spanlab.tito.templates import check_template

if TYPE_CHECKING:
    import pyarrow as pa

DriftCause = Literal["non_canonical_bpe", "tool_call_reserialization", "template"]
CAUSES: tuple[DriftCause, ...] = ("non_canonical_bpe", "tool_call_reserialization", "template")
_SNIPPET = 80

@dataclass(frozen=True)
class RecordedCall:
    """The fields of one ``llm_call`` span the report reads."""

    span_id: str
    attempt_id: str | None
    request_messages: list[dict[str, Any]]
    request_tools: list[dict[str, Any]] | None
    response_message: dict[str, Any]
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    loss_mask: list[int] | None = None
    tito: bool = False  # served from a TITO buffer: its prompt is the buffer, not the engine's render
    agent: str | None = None  # the role of a multi-agent attempt: each role is its own conversation


class CauseCount(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    count: int
    rate: float


class CheckSummary(BaseModel):
    """One check: how many were checked, how many differ, and per cause (a pair may have several)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checked: int
    differs: int
    rate: float
    by_cause: dict[str, CauseCount]


class DriftExample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    check: Literal["response", "next_prompt"]
    cause: DriftCause
    span_id: str
    attempt_id: str | None
    recorded_text: str
    rerendered_text: str
    recorded_ids: list[int]
    rerendered_ids: list[int]


class DriftReport(BaseModel):
    """What :func:`drift_report` found; ``not_extending``: consecutive pairs not compared (history rewritten)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    calls: int
    response: CheckSummary
    next_prompt: CheckSummary
    not_extending: int
    examples: list[DriftExample]


def _summary(checked: int, differs: int, counts: dict[DriftCause, int]) -> CheckSummary:
    def rate(n: int) -> float:
        return n / checked if checked else 0.0

    return CheckSummary(checked=checked, differs=differs, rate=rate(differs),
                        by_cause={c: CauseCount(count=counts[c], rate=rate(counts[c])) for c in CAUSES})


Diff = tuple[DriftCause, list[int], list[int]]


def _align(ids: list[int], mask: list[int], render: list[int], tok: Any) -> list[Diff]:
    """Differences between a buffer and a render: (cause, buffer IDs, render IDs) per differing region."""
    walk = walk_render(ids, mask, render)
    diffs: list[Diff] = []
    for (lo, hi), (p, q) in walk.pairs:
        if (got := ids[lo:hi]) == (want := render[p:q]):
            continue
        got_text = tok.decode(got, skip_special_tokens=False)
        if got_text == tok.decode(want, skip_special_tokens=False):
            diffs.append(("non_canonical_bpe", got, want))
        else:
            diffs.append(("tool_call_reserialization" if "<tool_call>" in got_text else "template", got, want))
    if walk.broken is not None:
        lo, hi = walk.broken
        return [*diffs, ("template", ids[lo:hi], render[walk.at : walk.at + hi - lo])]
    if walk.end != len(render) or walk.open_sample is not None:
        diffs.append(("template", ids[walk.end :], render[walk.end :]))
    return diffs


def _example(check: Literal["response", "next_prompt"], cause: DriftCause, call: RecordedCall, got: list[int],
             want: list[int], tok: Any) -> DriftExample:
    at = first_mismatch(got, want) or 0
    lo = max(0, at - 8)
    return DriftExample(
        check=check, cause=cause, span_id=call.span_id, attempt_id=call.attempt_id,
        recorded_text=tok.decode(got[lo : lo + 24], skip_special_tokens=False)[:_SNIPPET],
        rerendered_text=tok.decode(want[lo : lo + 24], skip_special_tokens=False)[:_SNIPPET],
        recorded_ids=got[lo : lo + 24], rerendered_ids=want[lo : lo + 24],
    )


def _buffer_after(call: RecordedCall) -> SessionBuffer:
    """The session buffer right after ``call``: its prompt (with its mask when TITO recorded one) + its sample."""
    n_prompt, n_resp = len(call.prompt_token_ids), len(call.response_token_ids)
    mask = list(call.loss_mask[:n_prompt]) if call.loss_mask is not None else [0] * n_prompt
    return SessionBuffer(
        ids=[*call.prompt_token_ids, *call.response_token_ids], mask=[*mask, *([1] * n_resp)], segments=[0],
        sampled=[(n_prompt, n_prompt + n_resp)], messages=[*call.request_messages, call.response_message],
        tools=call.request_tools,
    )


def drift_report(calls: Sequence[RecordedCall], tokenizer: Any, *, max_examples: int = 3) -> DriftReport:
    """Run both checks over ``calls`` (ordered by attempt, agent role, then call order)."""
    closing = close_ids(tokenizer, check_template(tokenizer.chat_template, tokenizer))
    examples: dict[tuple[str, DriftCause], list[DriftExample]] = {}
    resp_counts = dict.fromkeys(CAUSES, 0)
    pair_counts = dict.fromkeys(CAUSES, 0)
    resp_differs = pairs = pair_differs = not_extending = 0

    def keep(check: Literal["response", "next_prompt"], cause: DriftCause, call: RecordedCall, got: list[int],
             want: list[int]) -> None:
        bucket = examples.setdefault((check, cause), [])
        if len(bucket) < max_examples:
            bucket.append(_example(check, cause, call, got, want, tokenizer))

    for i, call in enumerate(calls):
        ids = list(call.response_token_ids)
        again = tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=False), add_special_tokens=False)
        if again != ids:
            resp_differs += 1
            resp_counts["non_canonical_bpe"] += 1
            keep("response", "non_canonical_bpe", call, ids, again)
        nxt = calls[i + 1] if i + 1 < len(calls) else None
        if nxt is None or nxt.attempt_id is None or (nxt.attempt_id, nxt.agent) != (call.attempt_id, call.agent):
            continue
        buf = _buffer_after(call)
        if buf.extend(engine_form(nxt.request_messages), tokenizer, nxt.request_tools, close_ids=closing) is None:
            not_extending += 1
            continue
        pairs += 1
        engine = (render_ids(tokenizer, engine_form(nxt.request_messages), add_generation_prompt=True,
                             tools=nxt.request_tools) if nxt.tito else list(nxt.prompt_token_ids))
        if engine == buf.ids:
            continue
        pair_differs += 1
        diffs = _align(buf.ids, buf.mask, engine, tokenizer)
        for cause in {c for c, _, _ in diffs}:
            pair_counts[cause] += 1
        for cause, got, want in diffs:
            keep("next_prompt", cause, nxt, got, want)
    return DriftReport(
        calls=len(calls), response=_summary(len(calls), resp_differs, resp_counts),
        next_prompt=_summary(pairs, pair_differs, pair_counts), not_extending=not_extending,
        examples=[e for bucket in examples.values() for e in bucket],
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def recorded_calls(table: pa.Table) -> list[RecordedCall]:
    """The report's calls from an Arrow table of ``llm_call`` rows, in the table's order.

    Columns: ``span_id``, ``attempt_id``, ``agent``, ``request_messages``, ``request_tools``, ``response_message``
    (JSON text or values), ``prompt_token_ids``, ``response_token_ids``, ``loss_mask``, ``tito_mode``
    (``attributes.tito.mode``). Reading them from a store is the caller's: :mod:`spanlab.adapters.recorded_calls`.
    """
    return [
        RecordedCall(
            span_id=r["span_id"], attempt_id=r["attempt_id"], request_messages=_json(r["request_messages"]) or [],
            request_tools=_json(r["request_tools"]), response_message=_json(r["response_message"]) or {},
            prompt_token_ids=list(r["prompt_token_ids"] or []), response_token_ids=list(r["response_token_ids"]),
            loss_mask=r["loss_mask"], tito=r["tito_mode"] == "tito", agent=r["agent"],
        )
        for r in table.to_pylist()
    ]


def plot_report(report: DriftReport, path: Path) -> None:
    """Bar chart of the drift rate per cause and check (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SpanlabError("--plot needs matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"response\n{c}" for c in ("non_canonical_bpe",)] + [f"next prompt\n{c}" for c in CAUSES]
    rates = [report.response.by_cause["non_canonical_bpe"].rate] + [report.next_prompt.by_cause[c].rate for c in CAUSES]
    ax.bar(range(len(rates)), [100 * r for r in rates], color=["#4c72b0"] + ["#dd8452"] * len(CAUSES))
    ax.set_xticks(range(len(rates)), labels, fontsize=8)
    ax.set_ylim(0, max(5.0, 120 * max(rates)))
    ax.set_ylabel("% of checked")
    ax.set_title(f"retokenization drift: {report.calls} calls, {report.next_prompt.checked} extending pairs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
