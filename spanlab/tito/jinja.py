"""Render chat templates the way transformers' ``apply_chat_template`` does, without importing transformers.

Why not call transformers: the template checks must run on a bare ``.jinja`` file (no tokenizer, no
torch import) and must survive templates transformers refuses. So this mirrors
``transformers.utils.chat_template_utils._compile_jinja_template``: an ``ImmutableSandboxedEnvironment``
with ``trim_blocks``/``lstrip_blocks`` and ``loopcontrols``, the ``tojson`` filter with transformers'
semantics (no ASCII escaping, optional indent/separators), ``raise_exception`` and ``strftime_now``.
``{% generation %}`` blocks render their body (no assistant mask is computed); ``documents`` is None.

One deliberate extension: ``sandbox="mutable"`` (jinja's plain ``SandboxedEnvironment``) for templates
that mutate lists (Kimi's ``list.append``), which transformers' immutable sandbox rejects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

Sandbox = Literal["immutable", "mutable"]
Message = dict[str, Any]

SANDBOXES: dict[Sandbox, type[SandboxedEnvironment]] = {
    "immutable": ImmutableSandboxedEnvironment,  # what transformers (and so vLLM) uses
    "mutable": SandboxedEnvironment,  # still sandboxed (no private attributes), but lists may change
}

# What a template can raise while rendering: jinja's own errors (raise_exception, undefined names,
# sandbox refusals) and the Python errors of operations on the wrong types (str + dict, len(None)).
RENDER_ERRORS: tuple[type[Exception], ...] = (
    jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError,
)


class GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (marks assistant tokens); renders just its body."""

    tags = frozenset({"generation"})  # jinja only tests membership

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: plain ``json.dumps`` (jinja's own filter would HTML-escape ``<>&'``)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message: str) -> NoReturn:
    """Templates call this to reject a conversation (e.g. roles that do not alternate)."""
    raise jinja2.exceptions.TemplateError(message)


@dataclass(frozen=True)
class Renderer:
    """One compiled template plus the variables transformers passes besides the messages.

    ``now`` is fixed per renderer so that templates printing today's date (Llama 3.2, gpt-oss,
    Mistral) render the same text in both halves of a comparison, even across midnight.
    """

    template: jinja2.Template
    special_tokens: Mapping[str, str]
    sandbox: Sandbox

    def render(
        self, messages: Sequence[Message], *, tools: Sequence[Message] | None, add_generation_prompt: bool
    ) -> str:
        """Render like ``apply_chat_template(..., tokenize=False)``; raises one of ``RENDER_ERRORS``."""
        return self.template.render(
            messages=list(messages),
            tools=list(tools) if tools is not None else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
        )


def compile_template(
    text: str, *, sandbox: Sandbox = "immutable", special_tokens: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> Renderer:
    """Compile ``text`` in the chosen sandbox; raises ``jinja2.TemplateSyntaxError`` on bad syntax."""
    fixed_now = now or datetime.now()
    env = SANDBOXES[sandbox](trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, GenerationTag])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = fixed_now.strftime
    return Renderer(env.from_string(text), dict(special_tokens or {}), sandbox)
