"""Prefix arithmetic on chat-template renders: where two renders diverge, and the stop gap.

Why here and not in the template check: the TITO session buffer will need both at run time (to verify a
delta and to insert the gap), on any renderer, with no probing machinery attached.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from spanlab.tito.jinja import Message, Renderer

T = TypeVar("T")

_Q1, _ANSWER, _Q2 = "spanlab probe question", "spanlab probe answer", "spanlab probe follow-up"
_EOS_SENTINEL = "<|spanlab-eos-token|>"  # stands in for an unknown eos_token while finding the stop gap
# Shapes of special tokens in the templates we know: <|im_end|>, <turn|>, <|turn>, </s>, <end_of_turn>,
# <｜end▁of▁sentence｜>, [INST]. Used to find the end-of-turn token and the next header in find_stop_gap.
_SPECIAL_TOKEN_RE = re.compile(r"<[|｜]?/?[\w▁.:-]+[|｜]?>|\[/?[A-Z_]+\]")


def first_mismatch(before: Sequence[T], after: Sequence[T]) -> int | None:
    """Index where ``after`` stops extending ``before`` (chars or token IDs); None if ``before`` is a prefix."""
    for i, (a, b) in enumerate(zip(before, after, strict=False)):
        if a != b:
            return i
    return None if len(after) >= len(before) else len(after)


def find_stop_gap(renderer: Renderer, *, tools: Sequence[Message] | None = None) -> tuple[str, str | None]:
    """Return ``(stop_gap, end_of_turn)``: the text a template renders after the assistant's end-of-turn token.

    The model stops *at* its end-of-turn token and never samples what follows (ChatML's ``"\\n"`` after
    ``<|im_end|>``), so a TITO buffer must add that gap itself before the next delta. How it is found:
    render ``[user, assistant(MARKER), user(MARKER2)]``; take the region between the end of MARKER and the
    start of MARKER2 (end of turn + next header). The end-of-turn token is ``eos_token`` if the region
    starts with it, else the first special-token-shaped string in the region; the gap runs from there to
    the next special token (the next header's start), or, when the header has none, to where the render of
    ``[user, assistant(MARKER)]`` stops being a prefix. No special token at all: ``("", None)``.
    Without a known ``eos_token`` a sentinel is rendered in its place, and ``end_of_turn`` is then the
    literal ``"{{ eos_token }}"``. Caveat: GLM closes no turn; its next header ``<|user|>`` doubles as the
    stop token and is reported as the end of turn.
    """
    eos = renderer.special_tokens.get("eos_token") or _EOS_SENTINEL
    renderer = replace(renderer, special_tokens={**renderer.special_tokens, "eos_token": eos})
    conv: list[Message] = [{"role": "user", "content": _Q1}, {"role": "assistant", "content": _ANSWER}]
    closed = renderer.render(conv, tools=tools, add_generation_prompt=False)
    followed = renderer.render([*conv, {"role": "user", "content": _Q2}], tools=tools,
                               add_generation_prompt=False)
    start = followed.index(_ANSWER) + len(_ANSWER)
    region = followed[start : followed.index(_Q2, start)]
    if region.startswith(eos):
        eot, eot_end = eos, len(eos)
    elif match := _SPECIAL_TOKEN_RE.search(region):
        eot, eot_end = match.group(), match.end()
    else:
        return "", None
    header = _SPECIAL_TOKEN_RE.search(region, eot_end)
    diverge = first_mismatch(closed, followed)
    shared = (len(closed) if diverge is None else diverge) - start
    end = header.start() if header else max(eot_end, min(shared, len(region)))
    return region[eot_end:end], "{{ eos_token }}" if eot == _EOS_SENTINEL else eot
