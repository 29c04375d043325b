"""Token IDs as text for the token view, and which tokens re-tokenizing would change.

The drift mark is the drift report's response check (``spanlab/tito/drift.py``: decode the IDs, encode the
text again, compare), made per token: each run of equal loss mask (a sampled turn, or a prompt/tool delta)
is decoded and re-encoded on its own, and the recorded IDs that the re-encoding does not reproduce
(``difflib`` alignment of the two ID lists) are marked, with the IDs the tokenizer would have written.

The tokenizer is loaded on the first token view, not at startup (importing transformers takes seconds), and
is optional: without one the view shows IDs only.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spanlab.errors import SpanlabError
from spanlab.tito.buffer import mask_runs
from spanlab.ui.queries import TokenSequence

logger = logging.getLogger(__name__)
TokenizerLoader = Callable[[], Any]


def default_loader(tokenizer_dir: Path | None) -> TokenizerLoader:
    """Load ``tokenizer_dir``, else the default model's folder (converted once by ``ensure_default_model``)."""

    def load() -> Any:
        from spanlab.tito.templates import load_tokenizer

        folder = tokenizer_dir
        if folder is None:
            from spanlab.engine.model import ensure_default_model

            folder = ensure_default_model()
        return load_tokenizer(folder)

    return load


class TokenText:
    """Decodes token sequences for display; holds the tokenizer once loaded (per app, not global)."""

    def __init__(self, loader: TokenizerLoader | None) -> None:
        self._loader = loader
        self._tokenizer: Any = None
        self._error: str | None = None if loader is not None else "no tokenizer configured"
        self._lock = threading.Lock()

    def tokenizer(self) -> Any:
        """The tokenizer, or None when none is configured or it failed to load (the reason is logged once)."""
        with self._lock:
            if self._tokenizer is None and self._error is None and self._loader is not None:
                try:
                    self._tokenizer = self._loader()
                except (SpanlabError, OSError, ValueError, ImportError) as exc:
                    self._error = f"cannot load the tokenizer: {exc}"
                    logger.warning("token view shows IDs only: %s", self._error)
            return self._tokenizer

    @property
    def error(self) -> str | None:
        return self._error

    def render(self, seq: TokenSequence, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        """The JSON of the token view: per token its ID, text, mask, logprob and drift mark, for a window."""
        tok = self.tokenizer()
        n = len(seq.ids)
        hi = n if limit is None else min(n, offset + limit)
        marks: list[list[int] | None] = [None] * n
        texts: list[str] | None = None
        if tok is not None:
            for lo_run, hi_run, _ in mask_runs(seq.mask):
                for i, ids in _retokenize_diffs(tok, seq.ids[lo_run:hi_run]):
                    marks[lo_run + i] = ids
            texts = tok.batch_decode([[i] for i in seq.ids[offset:hi]], skip_special_tokens=False)
        return {
            **seq.title,
            "total": n, "offset": offset, "limit": hi - offset,
            "num_sampled": sum(seq.mask), "num_drift": sum(m is not None for m in marks),
            "segment_starts": seq.segment_starts,
            "ids": seq.ids[offset:hi], "mask": seq.mask[offset:hi], "logprobs": seq.logprobs[offset:hi],
            "text": texts, "retokenized": marks[offset:hi],
            "tokenizer": getattr(tok, "name_or_path", None), "tokenizer_error": self._error,
        }


def _retokenize_diffs(tok: Any, ids: list[int]) -> list[tuple[int, list[int]]]:
    """(index in ``ids``, re-encoded IDs of its region) for every token whose ID re-encoding does not give back.

    The re-encoded IDs of a differing region are attached to each token of it, so hovering any of them shows
    what the tokenizer would have written instead.
    """
    if not ids:
        return []
    again = tok.encode(tok.decode(ids, skip_special_tokens=False), add_special_tokens=False)
    if again == ids:
        return []
    out: list[tuple[int, list[int]]] = []
    matcher = difflib.SequenceMatcher(None, ids, again, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op != "equal":
            out += [(i, again[j1:j2]) for i in range(i1, i2)]
    return out
