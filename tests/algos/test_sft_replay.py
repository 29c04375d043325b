"""Replay in SFT rounds: the warm start's demonstrations, re-encoded exactly as the warm start encodes them.

Real SmolLM2 tokenizer and the calc task set's real demonstrations; no engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.filtered_dataset import IGNORE_INDEX
from spanlab.agents.calc import demonstration, make_tasks
from spanlab.algos.sft.config import SFTRoundsConfig
from spanlab.algos.sft.rounds import _row, replay_samples
from spanlab.errors import ConfigError


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def test_replay_draws_warm_start_demos_seeded_per_round(tokenizer: Any) -> None:
    pool = make_tasks("train", n=12, seed=0)
    expected = {tuple(encode_conversation(tokenizer, d["messages"], d["tools"]).input_ids)
                for d in map(demonstration, pool)}

    first = replay_samples(demonstration, pool, tokenizer, 4, seed=0, round_index=0)
    again = replay_samples(demonstration, pool, tokenizer, 4, seed=0, round_index=0)
    other = replay_samples(demonstration, pool, tokenizer, 4, seed=0, round_index=1)

    assert len(first) == 4
    assert all(tuple(s.input_ids) in expected for s in first + other)  # token for token a warm-start demo
    assert [s.input_ids.tolist() for s in first] == [s.input_ids.tolist() for s in again]  # seeded
    assert {tuple(s.input_ids) for s in first} != {tuple(s.input_ids) for s in other}  # another draw per round
    assert len({tuple(s.input_ids) for s in first}) == 4  # without repeats
    assert len(replay_samples(demonstration, pool, tokenizer, 50, seed=0, round_index=0)) == 12  # capped by the pool
    assert replay_samples(None, pool, tokenizer, 0, seed=0, round_index=0) == []


def test_a_replayed_row_trains_only_the_assistant_tokens(tokenizer: Any) -> None:
    (sample,) = replay_samples(demonstration, make_tasks("train", n=1, seed=0), tokenizer, 1, seed=0, round_index=0)
    row = _row(sample)
    labels = np.asarray(row["labels"])
    assert row["input_ids"] == sample.input_ids.tolist() and row["weight"] == 1.0
    assert ((labels != IGNORE_INDEX) == sample.loss_mask.astype(bool)).all()
    assert 0 < sample.loss_mask.sum() < len(sample.input_ids)  # prompt and tool result are not trained


def test_replay_without_demonstrations_is_a_config_error(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"sft\.replay"):
        replay_samples(None, make_tasks("train", n=2, seed=0), tokenizer, 2, seed=0, round_index=0)
    with pytest.raises(ValueError, match="replay"):
        SFTRoundsConfig(replay=-1)
