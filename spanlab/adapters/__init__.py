"""Adapters: turn stored spans into training batches (``grpo``: samples, padding, micro-batches)."""

from spanlab.adapters.grpo import Batch, Sample, collate, iter_samples, micro_batches

__all__ = ["Batch", "Sample", "collate", "iter_samples", "micro_batches"]
