"""A policy per agent role: LoRA adapters of one base model, served side by side by one vLLM (docs/multi_policy.md)."""
