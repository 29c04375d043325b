"""Prompt templates as data: POML checked against a safe subset, rendered with ``poml`` and cached.

See :mod:`spanlab.prompts.poml_template`.
"""

from __future__ import annotations

from spanlab.prompts.poml_template import (
    DEFAULT_RENDERER,
    PromptRenderer,
    TemplateError,
    check_template,
    static_problems,
    template_sha,
    variables_of,
)

__all__ = [
    "DEFAULT_RENDERER",
    "PromptRenderer",
    "TemplateError",
    "check_template",
    "static_problems",
    "template_sha",
    "variables_of",
]
