"""GRPO on the calc tutorial with its model loop on the Anthropic Messages API updates on the engine's exact IDs.

``tutorials/calc/quick.yaml`` with ``agent.kwargs.api: messages`` (the anthropic SDK against the gateway's
``/v1/messages``, TITO on as the file ships), on the session's shared vLLM (weights restored after), from the
session's shared calc warm start (``calc_warm_start``, tests/jobs/conftest.py): two GRPO steps of rollouts ->
update -> weight push. The sizes are chosen so that an update happens for real: at the quick test sizes (2 tasks
of levels 2-3, 2 samples each) the small warm start solved nothing and every step skipped its update. Here the
steps draw level-1 tasks (a bare operation, which the warm start solves at temperature 1 nearly always: 75 of
80 rollouts over three runs, 14/16, 48/48 and 13/16) in groups of :data:`GROUP`, and a step whose groups all
scored alike samples more tasks (``dynamic_sampling``, up to :data:`ROUNDS` more rounds, as long as level-1
tasks remain): at 62 in 64 right, a group differs about 1 time in 9 and a step finds none in 22 groups about 1
time in 15 (with 2 extra rounds, the 48-of-48 run updated nothing). RL alone trains (no
demonstration term), so the weights that change are changed by the GRPO loss on the recorded calls. The rewards
are the agent's own 0/1 scores.

Checked: every training call is a ``messages`` span (``/v1/messages``) served from its attempt's TITO buffer; at
least one step updated (``skipped`` 0, a group with reward variance) and the final weights differ from the warm
start's; each step's drift statistics are zero (on exact IDs they are zero by construction, so the next check is
the one that can fail); and every sample GRPO read is its attempt's ``tito_sessions`` sequence: the calls' prompt
and sampled IDs verbatim, the sampled IDs under the loss mask, each call's sampled IDs decoding to the answer the
agent got (``response_message``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from spanlab.adapters.sample_reader import iter_samples
from spanlab.config import load_yaml
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import run_job
from spanlab.store import SpanStore
from tests.jobs.quick_runs import TUTORIALS, WarmStart, from_warm_start, merged, smaller

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
logger = logging.getLogger(__name__)
DRIFT = ("drift_sample_frac", "drift_sequence_frac", "drift_token_frac")
TASKS, GROUP, ROUNDS = 2, 4, 10  # per step and round: tasks, and samples of each; extra rounds at most
# Level 1 only, RL alone; a step whose groups all scored alike samples up to ROUNDS more rounds of new tasks (DAPO's
# dynamic sampling, as a run with sparse rewards would): real rewards, more chances of a group that differs.
SIZES = {"agent": {"kwargs": {"api": "messages"}}, "dataset": {"train_levels": [1]}, "eval": {"tasks": 1},
         "grpo": {"tasks_per_step": TASKS, "group_size": GROUP, "demonstrations": None,
                  "dynamic_sampling": {"min_groups": 1, "max_rounds": ROUNDS}}}


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


def _weights(folder: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(path)
    assert tensors, folder
    return tensors


def test_grpo_through_messages_updates_on_the_sampled_ids(tmp_path: Path, restored_engine: str,
                                                          calc_warm_start: WarmStart, monkeypatch: pytest.MonkeyPatch,
                                                          tokenizer: Any) -> None:
    monkeypatch.chdir(TUTORIALS.parent)
    data = from_warm_start(smaller("calc", load_yaml(TUTORIALS / "calc" / "quick.yaml")), calc_warm_start,
                           restored_engine)
    data = merged(data, SIZES) | {"engine_url": restored_engine, "out_dir": str(tmp_path / "runs"),
                                  "db": str(tmp_path / "run.duckdb")}
    config = parse_train_config(data, "calc-messages")
    assert config.tito and config.token_source == "exact" and data["grpo"]["steps"] == 2
    start = time.perf_counter()
    report = run_job(config)
    logger.info("GRPO through /v1/messages: %.0f s; steps %s", time.perf_counter() - start,
                   [{k: step.get(k) for k in ("reward_mean", "n_groups_with_signal", "skipped", "step_s",
                                              "drift_logp_abs_diff")} for step in report.steps])
    assert len(report.steps) == 2
    for step in report.steps:
        assert {k: step[k] for k in DRIFT} == dict.fromkeys(DRIFT, 0.0), step
        assert step["n_samples"] in [k * TASKS * GROUP for k in range(1, ROUNDS + 2)], step
    updated = [step for step in report.steps if step["skipped"] == 0.0]
    assert updated, [(s["reward_mean"], s["n_groups_with_signal"]) for s in report.steps]
    for step in updated:  # the trainer's logprobs of the trained IDs vs the engine's, same weights: only numerics
        assert step["n_samples_used"] > 0 and step["grad_norm"] > 0 and step["drift_logp_abs_diff"] < 0.05, step
    before, after = _weights(calc_warm_start.folder), _weights(config.run_dir / "final")
    assert before.keys() == after.keys()
    assert any(not np.array_equal(before[k], after[k]) for k in before), "the update changed no weight"

    with SpanStore(config.db) as store:  # the job closed it
        train = [r["rollout_id"] for r in store.query("SELECT rollout_id FROM rollouts WHERE mode = 'train'")
                 .to_pylist()]
        samples = list(iter_samples(store, train))
        assert len(samples) == len(train) == sum(step["n_samples"] for step in report.steps)
        logger.info("rewards per rollout: %s", [s.reward for s in samples])
        spans = {s.span_id: s for s in store.iter_spans(rollout_ids=train) if s.kind == "llm_call"}
        assert spans and {s.name for s in spans.values()} == {"messages"}
        assert {s.attributes["endpoint"] for s in spans.values()} == {"/v1/messages"}
        assert {s.attributes["tito"]["mode"] for s in spans.values()} == {"tito"}
        assert len({s.reward for s in samples}) == 2  # 0/1 rewards, both seen
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
