"""GRPO on exact token IDs (``algorithm: grpo``)."""
