"""GRPO on the calc tutorial with its model loop on the Anthropic Messages API trains on the engine's exact IDs.

``tutorials/calc/quick.yaml`` with ``agent.kwargs.api: messages`` (the anthropic SDK against the gateway's
``/v1/messages``, TITO on as the file ships), at the test sizes of tests/jobs/test_quick_configs.py, on the session's
shared vLLM (weights restored after): a warm start, then two GRPO steps of rollouts -> update -> weight push. Every
training call must be a ``messages`` span served from the attempt's TITO buffer, each step's drift statistics must
be zero (nothing trained differs from what was sampled), and, checked here on its own, every sample GRPO reads is
its attempt's ``tito_sessions`` sequence: the calls' prompt and sampled IDs verbatim, the sampled IDs under the
loss mask, and each call's sampled IDs decode to the answer the agent got (``response_message``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spanlab.adapters.grpo import iter_samples
from spanlab.config import load_yaml
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job
from spanlab.store import SpanStore
from tests.jobs.test_quick_configs import TUTORIALS, restored_engine, smaller  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
DRIFT = ("drift_sample_frac", "drift_sequence_frac", "drift_token_frac")


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def _decoded_answer(tokenizer: Any, span: Any) -> None:
    """A text answer that ended on the stop token decodes, minus that token, to the content the agent got."""
    message = span.llm.response_message
    if message.get("tool_calls") or span.llm.finish_reason != "stop":
        return
    ids = list(span.llm.response_token_ids)
    assert tokenizer.decode(ids[:-1]) == message["content"], span.span_id


def test_grpo_through_messages_trains_on_the_sampled_ids(tmp_path: Path, restored_engine: str,  # noqa: F811
                                                         monkeypatch: pytest.MonkeyPatch, tokenizer: Any) -> None:
    monkeypatch.chdir(TUTORIALS.parent)
    data = smaller("calc", load_yaml(TUTORIALS / "calc" / "quick.yaml"))
    data["agent"]["kwargs"] = {**data["agent"]["kwargs"], "api": "messages"}
    data |= {"engine_url": restored_engine, "out_dir": str(tmp_path / "runs"), "db": str(tmp_path / "run.duckdb")}
    config = parse_train_config(data, "calc-messages")
    assert config.tito
    report = run_job(config)
    assert len(report.steps) == 2
    for step in report.steps:
        assert {k: step[k] for k in DRIFT} == dict.fromkeys(DRIFT, 0.0), step
        assert step["n_samples"] == 4
    print("steps:", [{k: step.get(k) for k in ("n_samples", "n_samples_used", "reward_mean", "drift_logp_abs_diff")}
                     for step in report.steps])
    first = report.steps[0]  # the trainer's logprobs of the trained IDs vs the engine's, same weights: only numerics
    if first["n_samples_used"] > 0:
        assert first["drift_logp_abs_diff"] < 0.05, first

    with SpanStore(config.db) as store:  # the job closed it
        train = [r["rollout_id"] for r in store.query("SELECT rollout_id FROM rollouts WHERE mode = 'train'")
                 .to_pylist()]
        samples = list(iter_samples(store, train))
        assert len(samples) == len(train) == 4 * 2
        spans = {s.span_id: s for s in store.iter_spans(rollout_ids=train) if s.kind == "llm_call"}
        assert spans and {s.name for s in spans.values()} == {"messages"}
        assert {s.attributes["tito"]["mode"] for s in spans.values()} == {"tito"}
        for sample in samples:
            calls = [spans[i] for i in sample.span_ids]
            (attempt,) = {c.attempt_id for c in calls}
            (row,) = store.query("SELECT token_ids, loss_mask FROM tito_sessions "
                                 f"WHERE attempt_id = '{attempt}'").to_pylist()
            assert sample.input_ids.tolist() == row["token_ids"] and sample.loss_mask.tolist() == row["loss_mask"]
            sampled = np.concatenate([np.asarray(c.llm.response_token_ids) for c in calls])
            assert np.array_equal(sample.input_ids[sample.loss_mask.astype(bool)], sampled)
            for call in calls:
                prompt, out = list(call.llm.prompt_token_ids), list(call.llm.response_token_ids)
                assert row["token_ids"][: len(prompt) + len(out)] == prompt + out
                _decoded_answer(tokenizer, call)
