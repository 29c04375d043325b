"""Adapters: turn stored spans into training data (``grpo``: samples, padding, micro-batches; ``sft``: a
reward-filtered SFT dataset on the exact token IDs)."""

from spanlab.adapters.grpo import Batch, Sample, collate, iter_samples, micro_batches
from spanlab.adapters.sft import (
    FilterConfig,
    FilterStats,
    as_hf_dataset,
    build_sft_dataset,
    filter_samples,
    read_dataset,
    rows_from_table,
    to_table,
    write_dataset,
)

__all__ = ["Batch", "FilterConfig", "FilterStats", "Sample", "as_hf_dataset", "build_sft_dataset", "collate",
           "filter_samples", "iter_samples", "micro_batches", "read_dataset", "rows_from_table", "to_table",
           "write_dataset"]
