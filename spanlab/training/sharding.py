"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the data-parallel trainer: ``trainer.sharding: fsdp``.

Why FSDP2 and these groups: each rank keeps 1/N of every parameter, gradient and optimizer state, so a
model N devices hold together trains where one device could not hold it. Each decoder layer (the classes
an HF model lists in ``_no_split_modules``, as accelerate and TRL wrap them) is one group, gathered for its
forward and backward and freed after; the rest (embeddings, final norm, LM head; tied embeddings stay in
one group) belongs to the root, a :class:`TokenLogprobs` around the model, whose forward is the whole
log-prob computation: its hooks gather those parameters before ``token_logprobs`` calls the decoder and
the head directly, and reduce their gradients in backward.

Gradients are summed over ranks, not averaged (FSDP's default): the loss is already normalized by the
whole batch's totals, as in the unsharded path. The reduction is forced to plain SUM, which gloo supports
(gloo has no PREMUL_SUM, FSDP's op for a custom divide factor), so the same code runs on CPU and on GPU.

Left out: LoRA (the adapter push would need its own gathering), mixed precision, CPU offload.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from spanlab.training.logprobs import TokenLogprobs

__all__ = ["full_state_dict", "shard_model"]

logger = logging.getLogger(__name__)


def shard_model(model: nn.Module, device: torch.device) -> TokenLogprobs:
    """``model`` sharded in place over the default process group's ranks, wrapped as a :class:`TokenLogprobs`.

    Every rank must call this with the same (already identical) weights: each keeps its own shard of them.
    """
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    root = fully_shard(TokenLogprobs(model), mesh=mesh)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    logger.info("FSDP2: %d layer groups + the root over %d ranks (%s)", len(layers), dist.get_world_size(),
                device.type)
    return root


def full_state_dict(model: TokenLogprobs) -> dict[str, torch.Tensor]:
    """The model's whole state dict (HF names) on rank 0's CPU, empty on the other ranks; every rank must call it."""
    return get_model_state_dict(model.lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

