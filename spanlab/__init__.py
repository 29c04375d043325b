"""spanlab: optimize LLM agents from their own traces (exact token IDs, DuckDB span store, GRPO/APO/SFT)."""

__version__ = "0.1.0"
