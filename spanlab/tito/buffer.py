"""The Token-In Token-Out (TITO) session buffer: one token sequence per agent session, the training truth.

Why: an agent sees text, but RL needs the exact IDs the policy sampled; re-encoding the model's decoded
turns gives other IDs (``H``+``AVING`` vs ``HAV``+``ING``; re-serialized tool calls). So the buffer holds
the first prompt's IDs (mask 0), each sampled turn verbatim (mask 1, stop token included), and before the
next call the template's *stop gap* (what it renders after the end-of-turn token; the model never samples
it) plus the *delta* of the new messages, ``render(conv + new, gen=True)[len(render(conv)):]`` (mask 0).
When the agent rewrites history, :meth:`SessionBuffer.extend` returns None and the caller starts a new
segment: its prompt is a fresh engine render (mask 0); earlier segments keep their masks, since each
segment is its own on-policy sequence. A turn that did not end on its end-of-turn token (cut at
``max_tokens``, or stopped by a stop string) keeps its cut IDs; ``extend(close_ids=...)`` then closes it with
the template's end-of-turn token and stop gap as prompt (mask 0), so the model reads what the template would
show it; without ``close_ids`` such a turn ends the segment. Templates that are not prefix-preserving for an
append make ``extend`` return None. The gateway (``spanlab/gateway/tito/``) drives it. REFERENCE §1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from spanlab.errors import SpanlabError
from spanlab.tito.jinja import Message
from spanlab.tito.prefix import first_mismatch
from spanlab.tito.render import render_ids

__all__ = [
    "BufferStateError", "ChatTokenizer", "Drift", "RenderComparison", "RenderWalk", "SessionBuffer",
    "compare_with_render", "normalize_message", "stop_gap_ids", "walk_render",
]


class BufferStateError(SpanlabError, RuntimeError):
    """A buffer method was called out of order (e.g. two prompts in a row without a sampled turn)."""


class ChatTokenizer(Protocol):
    """What the buffer needs: transformers' ``apply_chat_template`` (and ``decode`` for comparisons)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str: ...


def _arguments(value: Any) -> Any:
    """Tool-call arguments as a JSON value (key order and whitespace gone); raw text when it is not JSON."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def normalize_message(message: Message) -> Message:
    """The form two messages are compared in, tolerating what OpenAI clients change on the way back.

    Tolerated: keys whose value is None are dropped (``refusal``, ``audio``, ``function_call``...);
    ``content`` None, ``""`` and missing are equal; ``tool_calls`` None, ``[]`` and missing are equal;
    a call's ``type`` defaults to ``"function"`` and its ``arguments`` compare as parsed JSON (a dict or a
    JSON string; whitespace and key order ignored). Everything else must be equal, e.g. a dropped
    ``reasoning_content`` string counts as a rewrite.
    """
    out = {k: v for k, v in message.items() if v is not None}
    if out.get("content") in (None, ""):
        out.pop("content", None)
    if calls := out.pop("tool_calls", None):
        out["tool_calls"] = [_normalize_call(call) for call in calls]
    return out


def _normalize_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    kept = {k: v for k, v in call.items() if v is not None}
    args = _arguments(fn.get("arguments"))
    return {**kept, "type": kept.get("type", "function"), "function": {**fn, "arguments": args}}


def _same_messages(a: Sequence[Message], b: Sequence[Message]) -> bool:
    return len(a) == len(b) and all(normalize_message(x) == normalize_message(y) for x, y in zip(a, b, strict=True))


def stop_gap_ids(opened_ids: Sequence[int], closed_ids: Sequence[int], stop_id: int) -> list[int] | None:
    """Tokens a template renders after the assistant's end-of-turn token: ChatML's ``"\\n"`` (198 in SmolLM2).

    ``opened_ids``: the render that prompted the turn (``add_generation_prompt=True``); ``closed_ids``: the
    render with the assistant message (``False``). The gap follows the last ``stop_id`` in the assistant's
    part of ``closed_ids``. None when the stop token is not there (the model stopped on another token than
    the template writes, e.g. ``<|endoftext|>`` instead of ``<|im_end|>``): no safe seam exists.
    """
    start = first_mismatch(opened_ids, closed_ids)
    start = len(opened_ids) if start is None else start
    tail = list(closed_ids[start:])
    if stop_id not in tail:
        return None
    return tail[len(tail) - tail[::-1].index(stop_id) :]


@dataclass
class SessionBuffer:
    """Token IDs, loss mask and the conversation of one agent session, built in the same pass.

    ``segments`` holds start offsets into ``ids``; ``sampled`` holds ``(start, end)`` of each sampled
    turn. ``messages`` is the conversation as the agent saw it (assistant messages as returned to it).
    """

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    sampled: list[tuple[int, int]] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    awaiting_sample: bool = False  # True after a prompt was built, until the engine's answer is appended

    @classmethod
    def start(cls, prompt_ids: Sequence[int], messages: Sequence[Message],
              tools: list[dict[str, Any]] | None = None) -> SessionBuffer:
        """A buffer whose first prompt is the engine's own render of ``messages`` (mask 0)."""
        buf = cls(tools=tools)
        buf.new_segment(prompt_ids, messages, tools)
        return buf

    def new_segment(self, prompt_ids: Sequence[int], messages: Sequence[Message],
                    tools: list[dict[str, Any]] | None = None) -> None:
        """Start a segment after a history rewrite: everything the new prompt holds is frozen (mask 0)."""
        self.segments.append(len(self.ids))
        self.ids.extend(int(i) for i in prompt_ids)
        self.mask.extend([0] * len(prompt_ids))
        self.messages, self.tools, self.awaiting_sample = list(messages), tools, True

    def append_sampled(self, sampled_ids: Sequence[int], assistant_message: Message) -> None:
        """Append the engine's sampled IDs verbatim (mask 1, stop token included) and the message it became."""
        if not self.awaiting_sample:
            raise BufferStateError("append_sampled needs a prompt first (start, new_segment or extend)")
        self.sampled.append((len(self.ids), len(self.ids) + len(sampled_ids)))
        self.ids.extend(int(i) for i in sampled_ids)
        self.mask.extend([1] * len(sampled_ids))
        self.messages.append(dict(assistant_message))
        self.awaiting_sample = False

    def extend(self, request_messages: Sequence[Message], tokenizer: ChatTokenizer,
               tools: list[dict[str, Any]] | None = None,
               close_ids: Sequence[int] | None = None) -> list[int] | None:
        """Append stop gap + delta for the new messages (mask 0) and return the full prompt IDs.

        None (buffer unchanged) when the request does not extend the buffer's conversation (see
        :func:`normalize_message`), the tools changed, the last turn has no end-of-turn token where the
        template writes one (and no ``close_ids`` were given: the template's end-of-turn token + stop gap,
        used to close a cut turn), or the template does not keep the earlier render as a token prefix. The
        caller then renders the request itself and calls :meth:`new_segment`. The delta is rendered on the
        buffer's own messages plus the new ones, so client-side reformatting of old turns never leaks in.
        """
        if self.awaiting_sample:
            raise BufferStateError("extend needs the sampled turn of the previous prompt first")
        if not self.sampled or not self.extends(request_messages, tools):
            return None
        conv = self.conversation(request_messages)
        closed = render_ids(tokenizer, self.messages, add_generation_prompt=False, tools=tools)
        full = render_ids(tokenizer, conv, add_generation_prompt=True, tools=tools)
        opened = render_ids(tokenizer, self.messages[:-1], add_generation_prompt=True, tools=self.tools)

        def is_gap(gap: list[int]) -> bool:
            # A real gap is whitespace (ChatML "\n", Gemma "\n") or empty (Llama 3). Anything else means the
            # last sampled token was not an end-of-turn token (a truncated turn) and was found in the content.
            return not tokenizer.decode(gap, skip_special_tokens=False).strip()

        return self.append_delta(conv, opened=opened, closed=closed, full=full, close_ids=close_ids, is_gap=is_gap)

    def conversation(self, request_messages: Sequence[Message]) -> list[Message]:
        """The buffer's own messages plus the request's new ones (what the next prompt renders)."""
        return [*self.messages, *(dict(m) for m in request_messages[len(self.messages) :])]

    def append_delta(self, conv: list[Message], *, opened: Sequence[int], closed: Sequence[int],
                     full: Sequence[int], close_ids: Sequence[int] | None = None,
                     is_gap: Callable[[list[int]], bool] | None = None) -> list[int] | None:
        """Append stop gap + ``full[len(closed):]`` for ``conv`` from three renders, whoever made them.

        ``opened``: the render that prompted the last sampled turn (``self.messages[:-1]``, generation prompt);
        ``closed``: ``self.messages`` without one; ``full``: ``conv`` with one. The gateway gets them from the
        engine's ``/v1/chat/completions/render`` (so the delta is exactly what the engine renders) or from a
        local tokenizer (:meth:`extend`). ``is_gap`` vets a found gap (None: trust it). None (buffer
        unchanged) when no safe seam exists or ``closed`` is not a token prefix of ``full``.
        """
        if self.awaiting_sample:
            raise BufferStateError("append_delta needs the sampled turn of the previous prompt first")
        start, end = self.sampled[-1]
        if close_ids and (end == start or self.ids[end - 1] != close_ids[0]):
            gap: list[int] | None = [int(i) for i in close_ids]  # a cut turn: close it as the template would
        elif end == start:
            gap = None
        else:
            gap = stop_gap_ids(opened, closed, self.ids[end - 1])
            if gap is not None and is_gap is not None and not is_gap(gap):
                gap = None
        if gap is None or first_mismatch(closed, full) is not None:
            return None
        added = gap + [int(i) for i in full[len(closed) :]]
        self.ids.extend(added)
        self.mask.extend([0] * len(added))
        self.messages, self.awaiting_sample = conv, True
        return list(self.ids)

    def extends(self, request_messages: Sequence[Message], tools: list[dict[str, Any]] | None = None) -> bool:
        """Whether a request keeps this buffer's conversation and tools and adds messages after them."""
        n = len(self.messages)
        return (len(request_messages) > n and _same_messages(request_messages[:n], self.messages)
                and json.dumps(tools, sort_keys=True) == json.dumps(self.tools, sort_keys=True))

    def checkpoint(self) -> tuple[int, int, int, list[Message], list[dict[str, Any]] | None, bool]:
        """A cheap marker of the current state; :meth:`rollback` returns to it (a failed engine call)."""
        return (len(self.ids), len(self.segments), len(self.sampled), list(self.messages), self.tools,
                self.awaiting_sample)

    def rollback(self, state: tuple[int, int, int, list[Message], list[dict[str, Any]] | None, bool]) -> None:
        """Undo everything since :meth:`checkpoint`: IDs, masks and offsets only grow, so truncating is enough."""
        n_ids, n_segments, n_sampled, self.messages, self.tools, self.awaiting_sample = state
        del self.ids[n_ids:], self.mask[n_ids:], self.segments[n_segments:], self.sampled[n_sampled:]

    def segment(self, index: int = -1) -> tuple[list[int], list[int]]:
        """``(ids, mask)`` of one segment: a standalone training sequence."""
        bounds = [*self.segments, len(self.ids)]
        index = index % len(self.segments)
        lo, hi = bounds[index], bounds[index + 1]
        return self.ids[lo:hi], self.mask[lo:hi]


@dataclass(frozen=True)
class Drift:
    """A sampled turn whose IDs differ from the engine's re-render of the same text (what TITO preserves)."""

    buffer_span: tuple[int, int]  # offsets into the segment's ids
    render_span: tuple[int, int]  # offsets into RenderComparison.render_ids
    sampled_ids: list[int]
    render_ids: list[int]


@dataclass(frozen=True)
class RenderComparison:
    """The current segment against the engine's render of ``buffer.messages``.

    ``ok``: every mask-0 run equals the render verbatim and every sampled turn decodes to the same text as
    the render's tokens in its place; ``drift`` lists the sampled turns whose IDs differ anyway.
    ``problem`` says where the first disagreement is when not ok.
    """

    ok: bool
    render_ids: list[int]
    drift: list[Drift]
    problem: str | None = None


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, end, value)`` of each run of equal mask values."""
    runs: list[tuple[int, int, int]] = []
    for i, m in enumerate(mask):
        if runs and runs[-1][2] == m:
            runs[-1] = (runs[-1][0], i + 1, m)
        else:
            runs.append((i, i + 1, m))
    return runs


def find_sublist(haystack: Sequence[int], needle: Sequence[int], start: int) -> int | None:
    """First index >= ``start`` where ``needle`` occurs in ``haystack`` (None when it does not)."""
    n, needle = len(needle), list(needle)
    return next((q for q in range(start, len(haystack) - n + 1) if list(haystack[q : q + n]) == needle), None)


@dataclass
class RenderWalk:
    """A buffer segment laid over a render: where each sampled run's stand-in is, and where they part.

    Mask-0 runs (prompt) must appear in the render in order, token for token; the render's tokens between two
    of them stand for the sampled run in between (``pairs``). ``broken`` is the first prompt run that is not
    where it should be (buffer ``lo, hi``; render position ``at``); ``end`` is how far the render was covered.
    """

    pairs: list[tuple[tuple[int, int], tuple[int, int]]]  # (buffer span of a sampled run, its render span)
    broken: tuple[int, int] | None
    at: int
    end: int
    open_sample: tuple[int, int] | None  # a sampled run after the last prompt run (the segment ends sampled)


def walk_render(ids: Sequence[int], mask: Sequence[int], render: Sequence[int]) -> RenderWalk:
    """Lay ``ids`` (with its loss ``mask``) over ``render``: the walk both the buffer check and drift use."""
    pairs: list[tuple[tuple[int, int], tuple[int, int]]] = []
    p, pending = 0, None  # pending: the sampled run waiting for its end in the render
    for lo, hi, m in mask_runs(mask):
        if m == 1:
            pending = (lo, hi)
            continue
        q = p if pending is None else find_sublist(render, ids[lo:hi], p)
        if q is None or list(render[q : q + hi - lo]) != list(ids[lo:hi]):
            return RenderWalk(pairs, (lo, hi), p, p, pending)
        if pending is not None:
            pairs.append((pending, (p, q)))
        p, pending = q + hi - lo, None
    return RenderWalk(pairs, None, p, p, pending)


def compare_with_render(buffer: SessionBuffer, tokenizer: ChatTokenizer) -> RenderComparison:
    """Check the current segment (a prompt, so it ends with mask 0) against what the engine would render.

    Mask-0 runs must match the render token for token; the render's tokens between them stand for a
    sampled turn and must decode to the same text (special tokens kept), not the same IDs.
    """
    if buffer.awaiting_sample is False:
        raise BufferStateError("compare_with_render needs a prompt state (the segment must end with mask 0)")
    ids, mask = buffer.segment()
    render = render_ids(tokenizer, buffer.messages, add_generation_prompt=True, tools=buffer.tools)
    walk = walk_render(ids, mask, render)
    drift: list[Drift] = []
    for (lo, hi), (p, q) in walk.pairs:
        got, want = ids[lo:hi], render[p:q]
        if tokenizer.decode(got, skip_special_tokens=False) != tokenizer.decode(want, skip_special_tokens=False):
            return RenderComparison(False, render, drift, f"sampled tokens {(lo, hi)} decode to other text")
        if got != want:
            drift.append(Drift((lo, hi), (p, q), got, want))
    if walk.broken is not None:
        lo, hi = walk.broken
        return RenderComparison(False, render, drift, f"prompt tokens {lo}:{hi} are not in the render at {walk.at}")
    if walk.end != len(render):
        return RenderComparison(False, render, drift, f"the render has {len(render) - walk.end} tokens more")
    return RenderComparison(True, render, drift)
