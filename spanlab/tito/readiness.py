"""Can a gateway run Token-In Token-Out on this tokenizer's chat template? Fix it if a known fix applies.

Why at startup and not per call: the buffer appends each new message as a delta of two renders, which is
only right for a prefix-preserving template (REFERENCE §1). A gateway asked for TITO checks the template
once (:func:`~spanlab.tito.templates.check_template`, string and token level); when it fails and one of
the known one-line fixes (:mod:`spanlab.tito.fixes`) makes it pass, the gateway renders with the fixed
template and logs which line it changed; otherwise it refuses to start in TITO mode, with the reason,
rather than record sessions whose deltas may be wrong. The gateway sends token IDs, so the fix needs no
change on the engine's side.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from spanlab.errors import SpanlabError
from spanlab.tito.fixes import TemplateChange, fix_template
from spanlab.tito.templates import TemplateReport, check_template

logger = logging.getLogger(__name__)


class TitoUnavailableError(SpanlabError, RuntimeError):
    """TITO cannot run with this tokenizer, template or engine; the message says why and what to do."""


@dataclass(frozen=True)
class TitoTemplate:
    """The template a TITO gateway renders with, and what it needs to know about it.

    ``close_ids``: the end-of-turn token plus the stop gap (``<|im_end|>`` + ``\\n`` in ChatML), which
    close a turn the model did not end itself (cut at ``max_tokens``); None when the check found none.
    """

    text: str
    original: str
    report: TemplateReport
    changes: list[TemplateChange] = field(default_factory=list)
    close_ids: list[int] | None = None


def _refusal(name: str, report: TemplateReport) -> str:
    if report.string_level is not None and not report.string_level.ok:
        where = f"at character {report.string_level.first_mismatch} of the render"
    elif report.token_level is not None and not report.token_level.ok:
        where = f"at token {report.token_level.first_mismatch} (the strings agree; BPE merges across the seam)"
    else:
        where = "(see `spanlab template check`)"
    return (
        f"TITO refused: the chat template of {name} is not prefix-preserving when a tool result is appended "
        f"(the renders diverge {where}) and no known fix applies. Fix the template (`spanlab template check` / "
        "`spanlab template fix`) and serve it, or run the gateway with tito off (per-call recording)."
    )


def close_ids(tokenizer: Any, report: TemplateReport) -> list[int] | None:
    """``[end_of_turn_id, *stop_gap_ids]`` when the end-of-turn marker is one known token, else None."""
    eot = report.end_of_turn
    if eot == "{{ eos_token }}":
        eot = getattr(tokenizer, "eos_token", None)
    if not eot or report.stop_gap is None:
        return None
    ids = tokenizer.encode(eot, add_special_tokens=False)
    if len(ids) != 1:
        return None
    return [int(ids[0]), *(int(i) for i in tokenizer.encode(report.stop_gap, add_special_tokens=False))]


def prepare_template(tokenizer: Any, *, name: str = "the served model") -> TitoTemplate:
    """Check ``tokenizer.chat_template`` for TITO; apply a known fix (logged) or raise TitoUnavailableError.

    Does not change the tokenizer: the caller sets ``tokenizer.chat_template = result.text`` on its own copy.
    """
    text = getattr(tokenizer, "chat_template", None)
    if isinstance(text, dict):  # several named templates: transformers renders "default" for chat
        text = text.get("default")
    if not isinstance(text, str) or not text:
        raise TitoUnavailableError(f"TITO refused: the tokenizer of {name} has no chat template to render with")
    report = check_template(text, tokenizer, name=name)
    if report.error is not None:
        raise TitoUnavailableError(f"TITO refused: cannot check the chat template of {name}: {report.error}")
    changes: list[TemplateChange] = []
    final = text
    if not report.tool_append_prefix_preserving:
        fixed, changes = fix_template(text)
        fixed_report = check_template(fixed, tokenizer, name=f"{name} (fixed)") if changes else None
        if fixed_report is None or not fixed_report.tool_append_prefix_preserving:
            raise TitoUnavailableError(_refusal(name, report))
        for change in changes:
            logger.warning("TITO: applied known chat-template fix %s to %s (%s), line %d: %r -> %r",
                           change.fix, name, change.why, change.line, change.before.strip(), change.after.strip())
        final, report = fixed, fixed_report
    if not report.renders_tool_results:
        raise TitoUnavailableError(f"TITO refused: the chat template of {name} renders no tool result (not usable "
                                   "for tool calls): serve a tool-capable template, or run the gateway with tito off")
    for note in report.notes:
        logger.info("TITO template note (%s): %s", name, note)
    return TitoTemplate(text=final, original=text, report=report, changes=changes,
                        close_ids=close_ids(tokenizer, report))
