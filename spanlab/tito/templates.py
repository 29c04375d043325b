"""Template checks for Token-In Token-Out (TITO): can a session token buffer be built on this chat template?

A TITO buffer appends each tool result as a *delta* of two renders,
``render(conv + [tool], add_generation_prompt=True)[len(render(conv)):]`` (REFERENCE §1). That is only
right when appending a tool message never changes what was rendered before. :func:`check_template` runs
that test (string level always; token level with a tokenizer, since BPE merges can cross a seam) and
reports what else a buffer must know: does the template render tool calls and tool results at all, does
it need a ``tools`` list, and the ``stop_gap`` (see :func:`find_stop_gap`). :func:`fix_template` applies
the known one-line fixes (Qwen3's ``loop.last`` think block).

Real templates have quirks the check survives, trying in order and saying what it used
(``TemplateReport.variant``): without a ``tools`` list, then with one; ``arguments`` as a dict, then as a
JSON string; transformers' immutable sandbox, then a mutable one (Kimi's ``list.append``). The dummy call
ID is always 9 alphanumerics (Mistral rejects anything else). Left out: images, ``documents``, parallel
calls, and appends other than tool messages (only tool appends must preserve the prefix).
Run: ``spanlab template check TEMPLATE.jinja [--tokenizer DIR] [--json]``; ``spanlab template fix``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import jinja2
from pydantic import BaseModel, ConfigDict

from spanlab.tito.fixes import TemplateChange, fix_template
from spanlab.tito.jinja import RENDER_ERRORS, SANDBOXES, Message, Renderer, Sandbox, compile_template
from spanlab.tito.prefix import find_stop_gap, first_mismatch
from spanlab.tito.render import TemplateError

__all__ = [
    "DUMMY_TOOL", "RenderVariant", "StringLevel", "TemplateChange", "TemplateReport", "TokenLevel", "check_template",
    "check_template_file", "dummy_tool_conversation", "find_stop_gap", "first_mismatch", "fix_template",
    "load_tokenizer",
]
logger = logging.getLogger(__name__)

ArgumentsForm = Literal["dict", "json_string"]

DUMMY_CALL_ID = "dummy0001"  # 9 alphanumerics: Mistral templates raise on any other ID shape
DUMMY_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "dummy", "description": "dummy", "parameters": {"type": "object", "properties": {}}},
}
# Unique markers for the "does it render X at all" probes ("dummy" is everywhere in the prefix test).
_PROBE_FN, _PROBE_ARG, _PROBE_RESULT = "spanlab_probe_fn", "spanlab-probe-argument", "spanlab-probe-result"
_PROBE_Q1 = "spanlab probe question"
_PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": _PROBE_FN, "description": "probe", "parameters": {
        "type": "object", "properties": {"value": {"type": "string", "description": "probe value"}},
        "required": ["value"]}},
}


class TextTokenizer(Protocol):
    """What the token-level check needs: a transformers tokenizer's ``encode`` and special tokens."""

    @property
    def special_tokens_map(self) -> dict[str, Any]: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def dummy_tool_conversation(arguments: ArgumentsForm = "dict") -> tuple[list[Message], Message]:
    """The HF "TITO done right" test: [user, assistant(tool_calls)] and the tool message to append."""
    args: dict[str, Any] | str = {} if arguments == "dict" else "{}"
    call = {"id": DUMMY_CALL_ID, "type": "function", "function": {"name": "dummy", "arguments": args}}
    conv: list[Message] = [
        {"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    return conv, {"role": "tool", "tool_call_id": DUMMY_CALL_ID, "name": "dummy", "content": "dummy"}


class RenderVariant(BaseModel):
    """How the template was rendered: with a tools list or not, the arguments form, the sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tools: bool
    arguments: ArgumentsForm
    sandbox: Sandbox


class StringLevel(BaseModel):
    """The two renders of the tool-append test; ``first_mismatch`` is a character index."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    first_mismatch: int | None
    before: str
    after: str


class TokenLevel(BaseModel):
    """Both renders encoded without added special tokens; ``first_mismatch`` is a token index."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    first_mismatch: int | None
    ids_before: list[int]
    ids_after: list[int]


class TemplateReport(BaseModel):
    """Everything a TITO buffer needs to know about a template; ``error`` set means the check could not run.

    ``tool_append_prefix_preserving``: the string test passes and, when a tokenizer was given, the token
    test too, and the appended tool message renders at all: a template that drops tool turns (Phi-3.5-mini)
    keeps the prefix only because the tool's answer never reaches the prompt, which no tool agent can use.
    ``renders_tool_calls`` / ``renders_tool_results``: a probe call's name and argument value, or
    a probe result, appear after the user's question (content ``""`` as in the test; a note says when
    only ``None`` works). ``needs_tools``: without a tools list the test raises, or gives another
    (prefix, calls, results) answer; the verdict is the with-tools one. ``stop_gap`` /
    ``end_of_turn``: see :func:`~spanlab.tito.prefix.find_stop_gap` (None: could not be found).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    template: str
    tool_append_prefix_preserving: bool = False
    renders_tool_calls: bool = False
    renders_tool_results: bool = False
    needs_tools: bool = False
    stop_gap: str | None = None
    end_of_turn: str | None = None
    variant: RenderVariant | None = None
    string_level: StringLevel | None = None
    token_level: TokenLevel | None = None
    notes: list[str] = []
    error: str | None = None

    @property
    def usable_for_tools(self) -> bool:
        """Prefix-preserving and renders a tool result: a template whose prompts never show what a tool answered
        cannot serve a tool agent, however well its renders line up."""
        return self.error is None and self.tool_append_prefix_preserving and self.renders_tool_results

    @property
    def exit_code(self) -> int:
        """0 usable for TITO tool sessions, 1 not (not preserving, or no tool result rendered), 2 the check could
        not run (the CLI's exit status)."""
        return 2 if self.error is not None else 0 if self.usable_for_tools else 1


@dataclass(frozen=True)
class _Outcome:
    """One variant that rendered the whole test suite."""

    renderer: Renderer
    variant: RenderVariant
    before: str
    after: str
    renders_calls: bool
    renders_results: bool
    calls_need_null_content: bool  # renders the call only when the assistant's content is None, not ""

    def signature(self) -> tuple[bool, bool, bool]:
        return first_mismatch(self.before, self.after) is None, self.renders_calls, self.renders_results


def _after_question(text: str) -> str:
    """The text after the probe question: tool declarations (system or first user turn) come before it."""
    at = text.find(_PROBE_Q1)
    return text[at + len(_PROBE_Q1) :] if at >= 0 else text


def _probe(renderer: Renderer, *, tools: bool, arguments: ArgumentsForm, content: str | None) -> tuple[bool, bool]:
    """``(renders the call, renders the result)`` for a call and result carrying unique markers."""
    args: dict[str, Any] | str = {"value": _PROBE_ARG}
    args = args if arguments == "dict" else json.dumps(args)
    call = {"id": DUMMY_CALL_ID, "type": "function", "function": {"name": _PROBE_FN, "arguments": args}}
    probe: list[Message] = [
        {"role": "user", "content": _PROBE_Q1},
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": DUMMY_CALL_ID, "name": _PROBE_FN, "content": _PROBE_RESULT},
    ]
    probe_tools = [_PROBE_TOOL] if tools else None
    called = _after_question(renderer.render(probe[:2], tools=probe_tools, add_generation_prompt=False))
    answered = _after_question(renderer.render(probe, tools=probe_tools, add_generation_prompt=True))
    return _PROBE_FN in called and _PROBE_ARG in called, _PROBE_RESULT in answered


def _calls_need_null_content(renderer: Renderer, *, tools: bool) -> bool:
    """Whether calls render once the content is None (DeepSeek-R1-Distill), with either arguments form."""
    for arguments in ("dict", "json_string"):
        try:
            if _probe(renderer, tools=tools, arguments=arguments, content=None)[0]:
                return True
        except RENDER_ERRORS:
            continue
    return False


def _run(renderer: Renderer, *, tools: bool, arguments: ArgumentsForm) -> _Outcome:
    """Render the tool-append test and the probes for one variant; raises one of ``RENDER_ERRORS``."""
    conv, tool_msg = dummy_tool_conversation(arguments)
    tools_list = [DUMMY_TOOL] if tools else None
    before = renderer.render(conv, tools=tools_list, add_generation_prompt=False)
    after = renderer.render([*conv, tool_msg], tools=tools_list, add_generation_prompt=True)
    calls, results = _probe(renderer, tools=tools, arguments=arguments, content="")
    null_content = not calls and _calls_need_null_content(renderer, tools=tools)
    variant = RenderVariant(tools=tools, arguments=arguments, sandbox=renderer.sandbox)
    return _Outcome(renderer, variant, before, after, calls, results, null_content)


def _search(renderers: Mapping[Sandbox, Renderer], *, tools: bool) -> _Outcome | str:
    """First variant (dict, then JSON-string arguments; immutable, then mutable sandbox) that renders."""
    errors: list[str] = []
    for arguments in ("dict", "json_string"):
        for sandbox, renderer in renderers.items():
            try:
                return _run(renderer, tools=tools, arguments=arguments)
            except RENDER_ERRORS as exc:
                errors.append(f"{arguments} arguments, {sandbox} sandbox: {type(exc).__name__}: {exc}")
                if not isinstance(exc, jinja2.exceptions.SecurityError):
                    break  # a mutable sandbox only helps with sandbox refusals
    return "; ".join(errors)


def _special_tokens(tokenizer: TextTokenizer | None) -> dict[str, str]:
    """``bos_token``/``eos_token``... as transformers passes them; empty strings without a tokenizer."""
    if tokenizer is None:
        return {"bos_token": "", "eos_token": ""}
    return {k: str(v) for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}


def check_template(
    text: str, tokenizer: TextTokenizer | None = None, *, name: str = "<template>",
    special_tokens: Mapping[str, str] | None = None,
) -> TemplateReport:
    """Run the tool-append prefix test and the probes on ``text``; never raises for a bad template."""
    special = dict(special_tokens) if special_tokens is not None else _special_tokens(tokenizer)
    now = datetime.now()
    try:
        renderers = {sb: compile_template(text, sandbox=sb, special_tokens=special, now=now) for sb in SANDBOXES}
    except jinja2.TemplateSyntaxError as exc:
        return TemplateReport(template=name, error=f"template does not compile (line {exc.lineno}): {exc.message}")
    without, with_tools = _search(renderers, tools=False), _search(renderers, tools=True)
    notes: list[str] = []
    if isinstance(with_tools, _Outcome):  # agent sessions declare tools: judge the template with a tools list
        primary = with_tools
        needs_tools = not isinstance(without, _Outcome) or without.signature() != with_tools.signature()
        if not isinstance(without, _Outcome):
            notes.append(f"fails without a tools list: {without}")
        elif needs_tools:
            notes.append("without a tools list it renders differently (prefix ok, calls, results): "
                         f"{without.signature()} vs {with_tools.signature()}")
    elif isinstance(without, _Outcome):
        primary, needs_tools = without, False
        notes.append(f"fails with a tools list: {with_tools}")
    else:
        return TemplateReport(template=name, error=f"cannot render the tool-append test: {with_tools}")
    if primary.variant.sandbox == "mutable":
        notes.append("needs a mutable sandbox (it mutates a list): transformers' immutable sandbox rejects it")
    if primary.variant.arguments == "json_string":
        notes.append("rendered with arguments as a JSON string (a dict fails)")
    mismatch = first_mismatch(primary.before, primary.after)
    string = StringLevel(ok=mismatch is None, first_mismatch=mismatch, before=primary.before, after=primary.after)
    token = None
    if tokenizer is not None:
        ids_before = tokenizer.encode(primary.before, add_special_tokens=False)
        ids_after = tokenizer.encode(primary.after, add_special_tokens=False)
        tok_mismatch = first_mismatch(ids_before, ids_after)
        token = TokenLevel(ok=tok_mismatch is None, first_mismatch=tok_mismatch, ids_before=ids_before,
                           ids_after=ids_after)
    try:
        stop_gap, eot = find_stop_gap(primary.renderer, tools=[DUMMY_TOOL] if primary.variant.tools else None)
    except RENDER_ERRORS as exc:
        stop_gap, eot = None, None
        notes.append(f"stop gap unknown: {type(exc).__name__}: {exc}")
    if primary.calls_need_null_content:
        notes.append("renders tool calls only when the assistant's content is None (not \"\")")
    elif not primary.renders_calls:
        notes.append("renders no tool call: the assistant's call is dropped from later prompts")
    if not primary.renders_results:
        notes.append("renders no tool result: the model would never see what its tools answered")
        if string.ok:
            notes.append("not prefix-preserving although the renders line up: the appended tool message renders "
                         "nothing, so the buffer would never hold a tool turn")
    report = TemplateReport(
        template=name,
        tool_append_prefix_preserving=string.ok and (token is None or token.ok) and primary.renders_results,
        renders_tool_calls=primary.renders_calls, renders_tool_results=primary.renders_results,
        needs_tools=needs_tools, stop_gap=stop_gap, end_of_turn=eot, variant=primary.variant,
        string_level=string, token_level=token, notes=notes,
    )
    logger.debug("checked %s: preserving=%s", name, report.tool_append_prefix_preserving)
    return report


def check_template_file(path: Path, tokenizer: TextTokenizer | None = None) -> TemplateReport:
    """:func:`check_template` on a file; an unreadable file is a report with ``error`` (exit code 2)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return TemplateReport(template=str(path), error=f"cannot read {path}: {exc}")
    return check_template(text, tokenizer, name=str(path))


def load_tokenizer(path: os.PathLike[str] | str) -> TextTokenizer:
    """``AutoTokenizer.from_pretrained(path)`` (imports transformers, seconds, only when asked)."""
    if not Path(path).is_dir():  # fail before the transformers import, and with a clear message
        raise TemplateError(f"cannot load a tokenizer from {path}: not a folder")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    except (ImportError, OSError, ValueError) as exc:
        raise TemplateError(f"cannot load a tokenizer from {path}: {exc}") from exc
