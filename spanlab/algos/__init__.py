"""Training algorithms on stored spans: GRPO (``grpo``), per-token logprobs (``logprobs``), model loading."""
