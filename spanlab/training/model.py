"""Loading a Hugging Face causal LM for training (fp32 on CPU, optionally LoRA) and measuring its memory.

Why fp32: the CPU trainer has no fast bf16 matmul here and fp32 keeps the policy's logprobs comparable
to the engine's (served with ``--dtype float32``). LoRA needs the ``peft`` package, which is optional:
without it a LoRA config fails with an error that names the package instead of an ImportError deep down.
"""

from __future__ import annotations

import logging
import resource
import sys

from torch import nn

from spanlab.errors import ConfigError
from spanlab.training.settings import LoraConfig

__all__ = ["LoraConfig", "MissingDependencyError", "apply_lora", "peak_rss_mb"]

logger = logging.getLogger(__name__)


class MissingDependencyError(ConfigError, ImportError):
    """An option needs a package that is not installed (e.g. LoRA needs ``peft``)."""


def apply_lora(model: nn.Module, lora: LoraConfig) -> nn.Module:
    try:
        import peft
    except ImportError as exc:
        raise MissingDependencyError(
            "LoRA training needs the 'peft' package, which is not installed; install it (pinned in "
            "constraints.txt) or set lora: null for full fine-tuning"
        ) from exc
    peft_config = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules),
                                  lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return peft.get_peft_model(model, peft_config)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux ``VmHWM``; ``ru_maxrss`` elsewhere)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024
