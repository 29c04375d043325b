"""Torch training parts shared by the algorithms and the warm start: model loading, LoRA, logprobs, SFT, weight push."""
