"""Rendering a conversation to token IDs exactly as vLLM does, and the error a broken chat template raises.

Here rather than in :mod:`spanlab.engine` because the TITO buffer and the drift report need it and the
engine's template checks use :mod:`spanlab.tito`: one direction only (engine -> tito).
"""

from __future__ import annotations

from typing import Any, Protocol

from spanlab.errors import SpanlabError
from spanlab.tito.messages import engine_form


class TemplateError(SpanlabError, ValueError):
    """A chat template is missing, or it is not prefix-preserving for tool appends."""


class ChatTokenizer(Protocol):
    """What the prefix check needs from a tokenizer: transformers' ``apply_chat_template``."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def render_ids(
    tokenizer: ChatTokenizer,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None,
) -> list[int]:
    """Render messages to token IDs exactly as vLLM does (HF ``apply_chat_template``, no BOS), on the messages
    as vLLM hands them to the template (:func:`~spanlab.tito.messages.engine_form`)."""
    out = tokenizer.apply_chat_template(
        engine_form(messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        chat_template=chat_template,
    )
    # transformers 5 returns a BatchEncoding (dict-like); older versions a plain list.
    ids = out["input_ids"] if not isinstance(out, list) else out
    return [int(i) for i in ids]
