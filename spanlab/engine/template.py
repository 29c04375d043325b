"""The tool-capable chat template spanlab ships, and the token-level prefix check it must pass.

Why spanlab ships its own template: SmolLM2's template has no tools, and a Token-In Token-Out
(TITO) session buffer appends tool results as a *delta* of two renders,
``render(conv + [tool], add_generation_prompt=True)[len(render(conv)):]``. That is only correct
if appending a tool message never changes the tokens already rendered. ``chatml_tools.jinja``
renders every message as its own ChatML turn and never looks at ``loop.last``, so it is
prefix-preserving; :func:`check_tool_append_prefix` proves it at token level through the tokenizer's
own ``apply_chat_template`` (a string prefix is not enough: BPE merges can cross a seam). The dummy
conversation and the prefix comparison live in :mod:`spanlab.tito` (its ``spanlab template check``
runs the same test on any template file, without a tokenizer if need be).

Tool calls render in the Hermes format that vLLM's ``--tool-call-parser hermes`` reads back.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from spanlab.tito.prefix import first_mismatch
from spanlab.tito.render import ChatTokenizer, TemplateError, render_ids
from spanlab.tito.templates import DUMMY_TOOL, dummy_tool_conversation

__all__ = [
    "DEFAULT_TEMPLATE", "DUMMY_TOOL", "PrefixCheck", "check_tool_append_prefix", "dummy_tool_conversation",
    "install_chat_template", "load_template", "render_ids",
]

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "chatml_tools"


def load_template(name: str = DEFAULT_TEMPLATE) -> str:
    """Return the text of a template shipped in ``spanlab/engine/templates/<name>.jinja``."""
    path = resources.files("spanlab.engine").joinpath("templates").joinpath(f"{name}.jinja")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TemplateError(f"no shipped chat template named {name!r}") from exc


class PrefixCheck(BaseModel):
    """Result of the tool-append prefix check; ``delta_ids`` is what a TITO buffer appends."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    ids_before: list[int]
    ids_after: list[int]
    first_mismatch: int | None

    @property
    def delta_ids(self) -> list[int]:
        return self.ids_after[len(self.ids_before) :]


def check_tool_append_prefix(
    tokenizer: ChatTokenizer,
    *,
    chat_template: str | None = None,
    conversation: list[dict[str, Any]] | None = None,
    tool_message: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> PrefixCheck:
    """Check at token level that appending a tool message keeps the earlier render as a prefix."""
    if conversation is None or tool_message is None:
        conversation, tool_message = dummy_tool_conversation()
    tools = tools if tools is not None else [DUMMY_TOOL]
    before = render_ids(
        tokenizer, conversation, add_generation_prompt=False, tools=tools, chat_template=chat_template
    )
    after = render_ids(
        tokenizer,
        [*conversation, tool_message],
        add_generation_prompt=True,
        tools=tools,
        chat_template=chat_template,
    )
    mismatch = first_mismatch(before, after)
    return PrefixCheck(ok=mismatch is None, ids_before=before, ids_after=after, first_mismatch=mismatch)


def _atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file + rename so a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a model cache is meant to be readable
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_chat_template(model_dir: Path, template_text: str) -> bool:
    """Write the template into ``chat_template.jinja`` and ``tokenizer_config.json``.

    Both places are written (identically) because transformers 5 reads the ``.jinja`` file while
    older readers and some tools look in ``tokenizer_config.json``. Returns whether anything changed.
    """
    changed = False
    jinja_path = model_dir / "chat_template.jinja"
    if not jinja_path.exists() or jinja_path.read_text(encoding="utf-8") != template_text:
        _atomic_write_text(jinja_path, template_text)
        changed = True
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    if cfg.get("chat_template") != template_text:
        cfg["chat_template"] = template_text
        _atomic_write_text(cfg_path, json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
        changed = True
    if changed:
        logger.info("installed chat template into %s", model_dir)
    return changed
