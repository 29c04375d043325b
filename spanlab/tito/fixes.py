"""Known one-line fixes that make real chat templates prefix-preserving for tool appends.

Why a registry of textual patches rather than a template rewriter: the known failures are single
lines (Qwen3's think block keyed on ``loop.last``), and a patch the user can read in a diff is easier
to trust than a transformed template. Add a fix by adding an entry to ``KNOWN_FIXES``.
Run: ``spanlab template fix TEMPLATE.jinja [-o OUT]`` (it re-checks the result).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict


class TemplateChange(BaseModel):
    """One line a known fix rewrote (1-based line number)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fix: str
    why: str
    line: int
    before: str
    after: str


@dataclass(frozen=True)
class KnownFix:
    """A line-level regex patch and the reason it is needed."""

    why: str
    pattern: re.Pattern[str]
    replacement: str


# Qwen3 renders an empty <think></think> only while the assistant turn is last, so the turn's text
# changes once a tool result follows (REFERENCE §1); rendering the think block always fixes it.
# The replacement keeps the original's whitespace-control dashes.
KNOWN_FIXES: dict[str, KnownFix] = {
    "qwen3-think-loop-last": KnownFix(
        why="Qwen3 renders the <think> block only while the assistant turn is last",
        pattern=re.compile(
            r"\{%(-?)\s*if\s+loop\.last\s+or\s+\(\s*not\s+loop\.last\s+and\s+reasoning_content\s*\)\s*(-?)%\}"
        ),
        replacement=r"{%\1 if true \2%}",
    ),
}


def fix_template(text: str) -> tuple[str, list[TemplateChange]]:
    """Apply every known fix; returns the fixed text and what changed (an empty list: nothing applied)."""
    lines = text.splitlines(keepends=True)
    changes: list[TemplateChange] = []
    for name, fix in KNOWN_FIXES.items():
        for i, line in enumerate(lines):
            new = fix.pattern.sub(fix.replacement, line)
            if new != line:
                changes.append(TemplateChange(fix=name, why=fix.why, line=i + 1, before=line.rstrip("\r\n"),
                                              after=new.rstrip("\r\n")))
                lines[i] = new
    return "".join(lines), changes
