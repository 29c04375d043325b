"""POML prompt templates: a safe subset checked before anything renders them, and a render cache.

Why a subset: POML evaluates ``{{ ... }}``, ``if=``/``for=`` attributes and ``<let>`` as JavaScript in
a Node process with ``process`` reachable, and tags such as ``<document src>`` or ``<img src>`` read
files. A template an LLM wrote (an APO candidate) is untrusted code, so :func:`check_template` accepts
only allow-listed layout tags and attributes and ``{{ name }}`` references to declared variables. The
static check is pure Python and runs before poml ever sees the text; only then is it rendered once
(with marker values) to prove it parses and still places every required variable.

Why a cache: each ``poml.poml`` call spawns Node (measured here: 2.3-3.0 s wall, ~1.6 CPU-s, ~270 MB).
:class:`PromptRenderer` renders a template once with marker values (the "skeleton") and fills the
real values into the rendered messages when they are plain one-line text, which POML inserts verbatim
(``tests/apo/test_poml_template.py`` checks filled == rendered). Other values are rendered directly,
once per (template, values). Left out: POML's multimedia, tool and schema tags (not in the subset).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from spanlab.errors import SpanlabError

logger = logging.getLogger(__name__)

Messages = list[dict[str, Any]]

MAX_TEMPLATE_CHARS = 20_000
# Layout-only tags: none of them reads files, fetches URLs, binds variables or takes an expression.
ALLOWED_TAGS = frozenset({
    "poml", "role", "task", "output-format", "stepwise-instructions", "hint", "introducer", "examples", "example",
    "input", "output", "question", "system-msg", "human-msg", "ai-msg", "cp", "p", "span", "br", "h", "b", "i",
    "s", "u", "code", "list", "item", "section",
})
# Presentation-only attributes (compared lower-case). ``if``, ``for``, ``src``, ``value``, ... are refused.
ALLOWED_ATTRIBUTES = frozenset({
    "caption", "captionstyle", "captionending", "captiontexttransform", "liststyle", "syntax", "whitespace",
})
_MARKER = "SPANLABVAR{}X"
_REF = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_PLAIN_REF = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*")
_TAG = re.compile(r"<\s*(/?)\s*([A-Za-z][\w.-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*)>")
_ATTR = re.compile(r"\s*([A-Za-z_:][\w:.-]*)\s*=\s*(\"[^\"]*\"|'[^']*')")
# Values POML inserts verbatim: one line of ordinary text, no markup characters, no doubled spaces.
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9 .,:;!?'\"()/%+=@-]*")


class TemplateError(SpanlabError, ValueError):
    """A template failed the safety check or did not render; the message lists every problem."""


def template_sha(template: str) -> str:
    return hashlib.sha256(template.encode()).hexdigest()


def variables_of(template: str) -> list[str]:
    """The plain ``{{ name }}`` references of ``template``, in first-use order (expressions are skipped)."""
    names: list[str] = []
    for inner in _REF.findall(template):
        m = _PLAIN_REF.fullmatch(inner)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names


def static_problems(template: str, required: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    """Everything wrong with ``template`` that can be seen without running it (empty list: it passes)."""
    required = list(required)
    known = set(required) | set(allowed)
    problems: list[str] = []
    if len(template) > MAX_TEMPLATE_CHARS:
        problems.append(f"template has {len(template)} characters (max {MAX_TEMPLATE_CHARS})")
    if "<!" in template or "<?" in template:
        problems.append("declarations, comments and processing instructions (<! ... >, <? ... ?>) are not allowed")
    if "SPANLABVAR" in template:
        problems.append("the text SPANLABVAR is reserved for render markers")
    for inner in _REF.findall(template):
        m = _PLAIN_REF.fullmatch(inner)
        if m is None:
            problems.append(f"expression {{{{{inner.strip()[:60]}}}}} is not a plain variable reference "
                            "(POML evaluates it as JavaScript)")
        elif m.group(1) not in known:
            problems.append(f"unknown variable {{{{{m.group(1)}}}}} (known: {', '.join(sorted(known)) or 'none'})")
    leftover = _REF.sub("", template)
    if "{{" in leftover or "}}" in leftover:
        problems.append("unbalanced {{ or }}")
    for closing, tag, rest in _TAG.findall(template):
        if tag.lower() not in ALLOWED_TAGS:
            problems.append(f"tag <{tag}> is not allowed (allowed: layout tags only)")
            continue
        problems.extend(_attribute_problems(tag, rest, closing == "/"))
    present = set(variables_of(template))
    problems.extend(f"required variable {{{{{name}}}}} is missing" for name in required if name not in present)
    return list(dict.fromkeys(problems))  # an opening and a closing tag are one problem


def _attribute_problems(tag: str, rest: str, closing: bool) -> list[str]:
    body = rest.rstrip()
    body = body[:-1] if body.endswith("/") and not closing else body
    problems, pos = [], 0
    while pos < len(body):
        m = _ATTR.match(body, pos)
        if m is None:
            if body[pos:].strip():
                problems.append(f"<{tag}>: attribute syntax not allowed: {body[pos:].strip()[:40]!r}")
            break
        if closing or m.group(1).lower() not in ALLOWED_ATTRIBUTES:
            problems.append(f"<{tag}>: attribute {m.group(1)!r} is not allowed")
        pos = m.end()
    return problems


def check_template(template: str, required: Iterable[str], allowed: Iterable[str] = (), *,
                   renderer: PromptRenderer | None = None) -> list[str]:
    """Static problems, then (only if there are none) a render with marker values; empty list: accepted.

    The render must succeed, yield at least one message, and show every required variable's marker.
    """
    required = list(required)
    problems = static_problems(template, required, allowed)
    if problems:
        return problems
    renderer = renderer or DEFAULT_RENDERER
    names = sorted(set(required) | set(allowed))  # the same skeleton key the agent's renders use
    try:
        messages = renderer.skeleton(template, names)
    except TemplateError as exc:
        return [str(exc)]
    if not messages:
        return ["the template renders no message"]
    text = "\n".join(str(m.get("content", "")) for m in messages)
    return [f"required variable {{{{{name}}}}} does not appear in the rendered prompt"
            for name in required if _MARKER.format(names.index(name)) not in text]


def _plain(value: str) -> bool:
    return bool(_PLAIN_VALUE.fullmatch(value)) and value == value.strip() and "  " not in value


class PromptRenderer:
    """Renders POML to OpenAI chat messages, caching renders; thread-safe, at most ``max_parallel`` Nodes."""

    def __init__(self, max_parallel: int = 2) -> None:
        self._cache: dict[tuple[str, tuple[tuple[str, str], ...]], Messages] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, tuple[tuple[str, str], ...]], threading.Lock] = {}
        self._slots = threading.BoundedSemaphore(max_parallel)
        self.node_renders = 0  # poml (Node) calls made
        self.requests = 0

    def render(self, template: str, variables: Mapping[str, Any]) -> Messages:
        """Chat messages of ``template`` with ``variables``. Only give checked templates (see module doc)."""
        values = {k: str(v) for k, v in variables.items()}
        with self._lock:
            self.requests += 1
        if all(_plain(v) for v in values.values()):
            names = sorted(values)
            markers = {_MARKER.format(i): values[n] for i, n in enumerate(names)}
            skeleton = self._cached(template, {n: _MARKER.format(i) for i, n in enumerate(names)})
            if all(isinstance(m.get("content"), str) for m in skeleton):
                return [{**m, "content": _fill(m["content"], markers)} for m in skeleton]
        return self._cached(template, values)

    async def arender(self, template: str, variables: Mapping[str, Any]) -> Messages:
        return await asyncio.to_thread(self.render, template, variables)

    def skeleton(self, template: str, names: list[str]) -> Messages:
        """The render with marker ``SPANLABVAR{i}X`` for the i-th of ``names`` (sorted, as :meth:`render`)."""
        return self._cached(template, {n: _MARKER.format(i) for i, n in enumerate(names)})

    def _cached(self, template: str, values: dict[str, str]) -> Messages:
        key = (template_sha(template), tuple(sorted(values.items())))
        with self._lock:
            if key in self._cache:
                return self._cache[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # concurrent rollouts wanting the same render wait for one Node, not spawn eight
            with self._lock:
                if key in self._cache:
                    return self._cache[key]
            messages = self._render_now(template, values)
            with self._lock:
                self._cache[key] = messages
                self._key_locks.pop(key, None)
        return messages

    def _render_now(self, template: str, values: dict[str, str]) -> Messages:
        import poml

        with self._slots:
            try:
                out = poml.poml(template, context=values, format="openai_chat")
            except Exception as exc:  # poml raises RuntimeError (Node failed) or pydantic/JSON errors
                raise TemplateError(f"poml could not render the template: {exc}") from exc
            finally:
                with self._lock:
                    self.node_renders += 1
        messages = out.get("messages") if isinstance(out, dict) else None
        if not isinstance(messages, list):
            raise TemplateError(f"poml returned {type(out).__name__}, not {{'messages': [...]}}")
        return messages


def _fill(text: str, markers: Mapping[str, str]) -> str:
    for marker, value in markers.items():
        text = text.replace(marker, value)
    return text


DEFAULT_RENDERER = PromptRenderer()
"""Process-wide cache: agents are rebuilt per collection round, renders should outlive them."""
