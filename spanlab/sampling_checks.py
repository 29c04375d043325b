"""The sampling settings an agent's ``kwargs`` may carry, checked against the ranges the engine accepts.

Why here: an agent's kwargs are its own (``AgentConfig.kwargs`` is a free mapping), so ``temperature: -1`` used to
pass ``--check`` and every rollout then failed at the engine with a 400 that the run counted as failed attempts.
The names below mean the same thing in every OpenAI-style client (and vLLM's ``SamplingParams``), so a config
that gives one out of range is refused before anything starts, whichever agent it names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# name -> (lowest, highest, what the range reads as); bounds inclusive
_RANGES: dict[str, tuple[float, float, str]] = {
    "temperature": (0.0, 10.0, "from 0 (greedy) to 10"),
    "top_p": (1e-9, 1.0, "above 0 and at most 1"),
    "min_p": (0.0, 1.0, "from 0 to 1"),
    "presence_penalty": (-2.0, 2.0, "from -2 to 2"),
    "frequency_penalty": (-2.0, 2.0, "from -2 to 2"),
    "repetition_penalty": (1e-9, 10.0, "above 0 and at most 10"),
}
_INTEGERS: dict[str, tuple[int, str]] = {  # name -> (lowest, what the range reads as)
    "max_tokens": (1, "an integer >= 1"),
    "top_k": (-1, "-1 or 0 (off) or an integer >= 1"),
}


def sampling_problem(kwargs: Mapping[str, Any]) -> str | None:
    """``key: why`` for the first sampling setting of ``kwargs`` that the engine would refuse; None if none."""
    for name, (low, high, reads) in _RANGES.items():
        value = kwargs.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name}: expects a number {reads}, not {value!r}"
        if not (math.isfinite(value) and low <= value <= high):
            return f"{name}: {value} is out of range (a number {reads})"
    for name, (low, reads) in _INTEGERS.items():
        value = kwargs.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"{name}: expects {reads}, not {value!r}"
    return None
