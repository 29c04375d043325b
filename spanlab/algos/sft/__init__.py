"""Reward-filtered fine-tuning rounds (``algorithm: sft``), on the torch or the Unsloth trainer."""
