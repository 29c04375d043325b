"""A chat conversation -> trainer sample (token IDs and a loss mask on the assistant's tokens), for SFT.

Used for the warm start's demonstrations and by the re-tokenizing adapter. A conversation is rendered
with the served model's own chat template, so the model learns exactly the prompt the live agent will
send it; the mask comes from the character spans of the assistant turns, found by rendering the
conversation's prefixes (the template must be prefix-preserving, which spanlab's is and
``spanlab template check`` verifies for others).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spanlab.adapters.samples import Sample
from spanlab.errors import ConfigError


def encode_conversation(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> Sample:
    """Token IDs of a rendered conversation and a mask that is 1 on the assistant turns' tokens.

    A turn runs from the end of the generation prompt to its end-of-turn token inclusive (the model
    must learn to stop); the newline the template puts after that token is prompt, as at sampling time.
    """
    def render(msgs: list[dict], gen: bool) -> str:
        return tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=gen)

    full = render(messages, False)
    spans: list[tuple[int, int]] = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before, upto = render(messages[:i], True), render(messages[: i + 1], False)
        if not (full.startswith(upto) and upto.startswith(before)):
            raise ConfigError("the chat template is not prefix-preserving for this conversation; "
                              "check it with `spanlab template check`")
        spans.append((len(before), len(upto.rstrip())))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    mask = np.zeros(len(ids), dtype=np.uint8)
    for t, (start, _end) in enumerate(enc["offset_mapping"]):
        if any(a <= start < b for a, b in spans):
            mask[t] = 1
    return sft_sample(ids, mask)


def sft_sample(ids: np.ndarray, mask: np.ndarray) -> Sample:
    """A trainer row of token IDs and their loss mask; SFT needs no engine logprobs, reward or span IDs."""
    return Sample(rollout_id="", group_id="", input_ids=ids, loss_mask=mask,
                  engine_logprobs=np.zeros(len(ids), dtype=np.float32), reward=0.0, span_ids=[])
