"""The trained policy and the engine that samples from it: load once, push new weights after each update.

After every update the engine must serve the new weights, or the next rollouts are sampled from a
stale policy and the importance weights drift away from 1. Full fine-tuning writes one safetensors
file and asks vLLM to reload it in place (about 1.5 s for SmolLM2-135M on CPU, docs/engine.md); a
LoRA policy (a peft model) writes only its adapter and hot-loads it under its own served name.
Each push is also recorded (``record``; the job's records a versioned ``model_checkpoint`` resource in the store,
:func:`spanlab.jobs.groups.policy_recorder`), so every rollout queued afterwards carries the version it was
sampled from (``rollouts.resources_version``). Nothing here reads or writes the store itself. With several
engines (``engine: {replicas: N}`` or ``engine_urls``) every push reaches every one, the resource records the
version each serves, and the gateway is told, so each call's span names the version its engine served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spanlab.engine.weights import ReplicaWeightSync, SyncTiming, save_weights
from spanlab.training.model import apply_lora
from spanlab.training.settings import LoraConfig, SFTConfig
from spanlab.training.supervised import sft_train
from spanlab.types import version_tag

if TYPE_CHECKING:
    from spanlab.adapters.samples import Sample
    from spanlab.progress import PhaseProgress

logger = logging.getLogger(__name__)

VersionRecord = Callable[[dict[str, Any]], None]  # takes each push's version, path, method and replicas


def load_policy(model_dir: str | Path) -> tuple[torch.nn.Module, Any]:
    """The causal LM (fp32, train mode off) and its tokenizer from an HF folder or hub name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    return model, tokenizer


def pad_token_id(tokenizer: Any) -> int:
    """Padding never enters a loss (masks are 0 there), so any real ID works when none is defined."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


@dataclass
class PolicySync:
    """Pushes the trainer's weights to the running vLLM servers and hands each version to ``record``."""

    client: ReplicaWeightSync
    record: VersionRecord
    out_dir: Path
    base_served_name: str
    version: int = 0
    timings: list[SyncTiming] = field(default_factory=list)
    served_name: str = ""  # what agents must ask for: the base name (full reload) or the adapter's (LoRA)
    pushed_dir: Path | None = None  # the last folder push_dir served (the policy's weights live there, not in torch)
    pause_lora: bool = False  # LoRA pushes pause the engine too, so running requests end on the old adapter

    def __post_init__(self) -> None:
        self.served_name = self.served_name or self.base_served_name

    def push(self, model: torch.nn.Module) -> SyncTiming:
        self.version += 1
        tag = version_tag("policy", self.version)
        path, timing = self._send(model, tag)
        self.pushed_dir = None
        return self._record(tag, path, timing)

    def serve_again(self, model: torch.nn.Module) -> SyncTiming:
        """Serve ``model`` as the current version without recording a new one (a resumed run's restored weights:
        rollouts must keep naming the version the store already holds)."""
        return self._send(model, version_tag("policy", self.version))[1]

    def _send(self, model: torch.nn.Module, tag: str) -> tuple[Path, SyncTiming]:
        if hasattr(model, "peft_config"):  # a peft LoRA model: ship the adapter only
            path = self.out_dir / "adapter"
            model.save_pretrained(str(path))
            self.served_name = "policy"
            return path, self.client.load_lora("policy", path, inplace=True, version=tag, pause=self.pause_lora)
        path = save_weights(model.state_dict(), self.out_dir / "weights")
        self.served_name = self.base_served_name
        return path, self.client.reload_weights(path, version=tag)

    def push_state(self, state: dict[str, torch.Tensor]) -> SyncTiming:
        """Serve full weights given as a state dict: a sharded trainer's, gathered on rank 0, whose torch model
        holds only a shard (so checkpoints then take these files, see :meth:`push_dir`)."""
        return self.push_dir(save_weights(state, self.out_dir / "weights"))

    def push_dir(self, path: Path) -> SyncTiming:
        """Serve full weights another trainer saved (an HF folder with safetensors, e.g. Unsloth's merged save)."""
        self.version += 1
        tag = version_tag("policy", self.version)
        timing = self.client.reload_weights(path, version=tag)
        self.served_name = self.base_served_name
        self.pushed_dir = Path(path)
        return self._record(tag, path, timing)

    def _record(self, tag: str, path: Path, timing: SyncTiming) -> SyncTiming:
        self.timings.append(timing)
        self.record({"version": self.version, "path": str(path), "method": timing.method,
                     "replicas": dict(self.client.versions)})
        logger.info("engine serves %s (%s, %.2fs)", tag, timing.method, timing.total_s)
        return timing


@dataclass
class Policy:
    """The model a job trains, its tokenizer, and the push that makes the engine serve it."""

    model: torch.nn.Module
    tokenizer: Any
    pad_id: int
    sync: PolicySync

    def push(self) -> float:
        """Serve the current weights; the seconds it took."""
        return self.sync.push(self.model).total_s


def open_policy(stack: ExitStack, *, model_name: str, root_url: str | Sequence[str], served: str,
                record: VersionRecord, run_dir: Path, lora: LoraConfig | None, torch_threads: int | None,
                on_served: Callable[[str, str | None], None] | None = None, device: str = "cpu") -> Policy:
    """Load the served model for training (wrapped in LoRA when given: the engine then hot-loads the adapter).

    ``root_url``: the engine, or every replica's; ``on_served(url, version)`` after each replica's push; ``record``:
    each pushed version (:class:`PolicySync`);
    ``device``: where the model trains (``cuda`` for ``trainer: {device: gpu}`` in one process)."""
    from spanlab.engine.model import resolve_model

    torch.set_num_threads(torch_threads or torch.get_num_threads())
    urls = [root_url] if isinstance(root_url, str) else list(root_url)
    client = stack.enter_context(ReplicaWeightSync(urls, on_served=on_served))
    model, tokenizer = load_policy(resolve_model(model_name))
    if lora is not None:
        model = apply_lora(model, lora)
    model.to(device)
    return Policy(model, tokenizer, pad_token_id(tokenizer), PolicySync(client, record, run_dir, served))


def warm_start(policy: Policy, samples: list[Sample], config: SFTConfig, *,
               progress: PhaseProgress | None) -> dict[str, float]:
    """SFT on demonstrations (encoded conversations; the job reads them from its store), then pushed (a model that
    never earns a reward gives RL and reward filtering nothing to keep)."""
    metrics = sft_train(policy.model, samples, config, pad_id=policy.pad_id, progress=progress)
    return {**metrics, "sync_s": policy.push()}
