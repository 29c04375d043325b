"""Adapters: turn stored spans into training data (``grpo``: samples, padding, micro-batches; ``sft``: a
reward-filtered SFT dataset on the exact token IDs; ``messages``: conversations for APO's critiques; ``credit``:
the reward each turn trains on, the final one broadcast or its discounted return).

Names are resolved on first use, so importing one adapter module (``spanlab.adapters.messages``, which
APO uses) never imports torch through the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CreditConfig": "credit", "TurnReward": "credit", "turn_rewards": "credit",
    "Batch": "grpo", "Sample": "grpo", "collate": "grpo", "iter_samples": "grpo", "micro_batches": "grpo",
    "FilterConfig": "sft", "FilterStats": "sft", "as_hf_dataset": "sft", "build_sft_dataset": "sft",
    "filter_samples": "sft", "read_dataset": "sft", "rows_from_table": "sft", "to_table": "sft",
    "write_dataset": "sft",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'spanlab.adapters' has no attribute {name!r}")
    return getattr(importlib.import_module(f"spanlab.adapters.{_EXPORTS[name]}"), name)
