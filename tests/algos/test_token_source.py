"""``token_source``: exact engine IDs vs re-tokenized stored text, on a real store with the real SmolLM2 tokenizer.

The spans are built the way the gateway records them (prompt = the template's render, response = sampled IDs,
TITO loss masks over the session), with a response the "model" spelled with a non-canonical BPE split: same
text, other IDs. Re-tokenizing must then give other trained tokens (and the drift statistics must count
them), while ``exact`` returns the stored IDs untouched. No vLLM needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from spanlab.adapters.retokenize import align_logprobs, drift_stats
from spanlab.adapters.sample_reader import iter_samples
from spanlab.adapters.samples import Sample, collate
from spanlab.algos.grpo.update import GRPOConfig, grpo_step
from spanlab.engine.template import render_ids
from spanlab.errors import ConfigError
from spanlab.jobs.config import parse_train_config
from spanlab.store import StoreAPI
from spanlab.training.logprobs import token_logprobs
from spanlab.types import LLMCall, Span, reward_span

VARIANT = Path(__file__).resolve().parents[2] / "tutorials" / "drift" / "chatml_tools_variant.jinja"
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                           "parameters": {"type": "object", "properties": {
                                               "expression": {"type": "string"}}, "required": ["expression"]}}}]
SYSTEM = {"role": "system", "content": "Use the calculator tool, then reply: The answer is N."}
USER = {"role": "user", "content": "Tom buys 3 packs of 5 cards and 8 more cards. How many cards?"}
CALL = {"id": "call1", "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "3 * 5 + 8"}'}}
TOOL_TURN = {"role": "assistant", "content": None, "tool_calls": [CALL]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call1", "content": "23"}
ANSWER = "The answer is 23."


@pytest.fixture
def store(any_store: StoreAPI) -> StoreAPI:
    """Every test here runs on SpanStore and on StoreClient over HTTP to a store server (tests/stores.py)."""
    return any_store


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


def _ids(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _non_canonical(tok: Any, text: str, cut: int) -> list[int]:
    """``text`` spelled as two separately encoded halves: decodes to the same text, other IDs."""
    ids = _ids(tok, text[:cut]) + _ids(tok, text[cut:])
    assert tok.decode(ids) == text and ids != _ids(tok, text)
    return ids


def _tool_call_ids(tok: Any) -> list[int]:
    """The tool-call turn as the model samples it (the shipped template's Hermes form) + <|im_end|>."""
    return _ids(tok, '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * 5 + 8"}}\n</tool_call>'
                     "<|im_end|>")


def _record(store: StoreAPI, spans: list[LLMCall], reward: float = 1.0) -> tuple[str, list[Span]]:
    store.enqueue_one({"task_id": "t"})
    got = store.dequeue(worker_id="w")
    assert got is not None
    rollout, attempt = got
    calls = [Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, name="chat.completions",
                  kind="llm_call", llm=llm) for llm in spans]
    store.add_spans([*calls, reward_span(rollout.rollout_id, attempt.attempt_id, reward)])
    store.finish_attempt(attempt.attempt_id, "succeeded")
    return rollout.rollout_id, calls


def _triplet(tok: Any, response_ids: list[int], content: str) -> LLMCall:
    """A per-call span: the engine's render of the messages, the sampled IDs, the parsed response message."""
    messages = [SYSTEM, USER]
    prompt = render_ids(tok, messages, add_generation_prompt=True, tools=TOOLS)
    return LLMCall(model="m", request_messages=messages, request_tools=TOOLS, finish_reason="stop",
                   response_message={"role": "assistant", "content": content}, prompt_token_ids=prompt,
                   response_token_ids=response_ids, response_logprobs=[-0.5] * len(response_ids))


def _session(tok: Any, answer_ids: list[int]) -> list[LLMCall]:
    """Two TITO calls: a tool call, then (buffer + stop gap + tool delta) and the answer ``answer_ids``."""
    conv = [SYSTEM, USER]
    p1 = render_ids(tok, conv, add_generation_prompt=True, tools=TOOLS)
    r1 = _tool_call_ids(tok)
    rendered = render_ids(tok, [*conv, TOOL_TURN], add_generation_prompt=False, tools=TOOLS)
    delta = render_ids(tok, [*conv, TOOL_TURN, TOOL_RESULT], add_generation_prompt=True, tools=TOOLS)[len(rendered):]
    p2 = [*p1, *r1, *_ids(tok, "\n"), *delta]
    mask1 = [0] * len(p1) + [1] * len(r1)
    mask2 = [*mask1, *[0] * (len(p2) - len(mask1)), *[1] * len(answer_ids)]
    first = LLMCall(model="m", request_messages=conv, request_tools=TOOLS, response_message=TOOL_TURN,
                    finish_reason="tool_calls", prompt_token_ids=p1, response_token_ids=r1,
                    response_logprobs=[-0.1] * len(r1), loss_mask=mask1)
    second = LLMCall(model="m", request_messages=[*conv, TOOL_TURN, TOOL_RESULT], request_tools=TOOLS,
                     response_message={"role": "assistant", "content": ANSWER}, finish_reason="stop",
                     prompt_token_ids=p2, response_token_ids=answer_ids,
                     response_logprobs=[-0.2] * len(answer_ids), loss_mask=mask2)
    return [first, second]


def _trained(s: Sample) -> list[int]:
    return s.input_ids[s.loss_mask.astype(bool)].tolist()


def test_non_canonical_triplet_differs_when_retokenized_and_exact_keeps_the_stored_ids(store: StoreAPI,
                                                                                      tok: Any) -> None:
    sampled = [*_non_canonical(tok, ANSWER, 6), tok.convert_tokens_to_ids("<|im_end|>")]
    rid, (call,) = _record(store, [_triplet(tok, sampled, ANSWER)])

    (exact,) = iter_samples(store, [rid], token_source="exact", tokenizer=tok)
    assert exact.input_ids.tolist() == [*call.llm.prompt_token_ids, *sampled] and _trained(exact) == sampled
    assert exact.exact is None and drift_stats([exact])["drift_sample_frac"] == 0.0

    (retok,) = iter_samples(store, [rid], token_source="retokenized", tokenizer=tok)
    assert retok.exact is not None and retok.exact.input_ids.tolist() == exact.input_ids.tolist()
    assert _trained(retok) == [*_ids(tok, ANSWER), sampled[-1]]  # the canonical split, then <|im_end|>
    assert tok.decode(_trained(retok)) == tok.decode(sampled)  # same text
    assert retok.input_ids[: len(call.llm.prompt_token_ids)].tolist() == call.llm.prompt_token_ids  # same context
    assert np.isnan(retok.engine_logprobs[retok.loss_mask.astype(bool)]).all()  # no engine logprobs: TIS weight 1
    aligned = retok.aligned_logprobs[retok.loss_mask.astype(bool)]
    assert 0 < np.isfinite(aligned).sum() < len(aligned) and np.allclose(aligned[np.isfinite(aligned)], -0.5)
    stats = drift_stats([exact, retok])
    assert stats["drift_sample_frac"] == 0.5 and stats["drift_sequence_frac"] == 0.5
    assert 0 < stats["drift_token_frac"] < 1


def test_canonical_session_retokenizes_to_the_same_ids_and_a_non_canonical_turn_is_counted(store: StoreAPI,
                                                                                          tok: Any) -> None:
    end = tok.convert_tokens_to_ids("<|im_end|>")
    clean, _ = _record(store, _session(tok, [*_ids(tok, ANSWER), end]))
    drifted, _ = _record(store, _session(tok, [*_non_canonical(tok, ANSWER, 9), end]))
    exact = {s.rollout_id: s for s in iter_samples(store, [clean, drifted])}
    retok = {s.rollout_id: s for s in iter_samples(store, [clean, drifted], token_source="retokenized", tokenizer=tok)}

    # The whole conversation re-rendered by the same template gives the TITO buffer back, token for token.
    assert retok[clean].input_ids.tolist() == exact[clean].input_ids.tolist()
    assert retok[clean].loss_mask.tolist() == exact[clean].loss_mask.tolist()
    assert drift_stats([retok[clean]]) == {"drift_sample_frac": 0.0, "drift_sequence_frac": 0.0,
                                           "drift_token_frac": 0.0}
    # The non-canonical answer: the tool-call turn is unchanged, the answer turn is the canonical split.
    assert _trained(retok[drifted]) != _trained(exact[drifted])
    assert _trained(retok[drifted]) == _trained(retok[clean])
    assert drift_stats([retok[clean], retok[drifted]])["drift_sample_frac"] == 0.5


def test_template_variant_models_a_stack_mismatch(store: StoreAPI, tok: Any) -> None:
    rid, _ = _record(store, _session(tok, [*_ids(tok, ANSWER), tok.convert_tokens_to_ids("<|im_end|>")]))
    (exact,) = iter_samples(store, [rid])
    (retok,) = iter_samples(store, [rid], token_source="retokenized", tokenizer=tok, chat_template=VARIANT)
    assert "<tool_call>{" in tok.decode(_trained(retok)) and "<tool_call>\n{" in tok.decode(_trained(exact))
    stats = drift_stats([retok])
    assert stats["drift_sample_frac"] == 1.0 and stats["drift_sequence_frac"] == 1.0 and stats["drift_token_frac"] > 0


def test_bad_options_are_refused(store: StoreAPI, tok: Any, tmp_path: Path) -> None:
    rid, _ = _record(store, [_triplet(tok, _ids(tok, ANSWER), ANSWER)])
    with pytest.raises(ConfigError, match="tokenizer"):
        list(iter_samples(store, [rid], token_source="retokenized"))
    with pytest.raises(ConfigError, match="not a file"):
        list(iter_samples(store, [rid], token_source="retokenized", tokenizer=tok, chat_template=tmp_path / "no"))
    with pytest.raises(ValueError, match="token_source"):
        list(iter_samples(store, [rid], token_source="text"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only used with"):
        list(iter_samples(store, [rid], chat_template=VARIANT))


def test_train_config_validates_token_source_and_template(tmp_path: Path) -> None:
    assert parse_train_config({}).token_source == "exact"
    ok = parse_train_config({"token_source": "retokenized", "retokenize_template": str(VARIANT)})
    assert ok.retokenize_template == VARIANT
    for bad, where in (({"token_source": "text"}, "token_source"),
                       ({"retokenize_template": str(VARIANT)}, "only used with token_source: retokenized"),
                       ({"token_source": "retokenized", "retokenize_template": str(tmp_path / "x.jinja")},
                        "is not a file")):
        with pytest.raises(ConfigError, match=where):
            parse_train_config(bad)


def test_align_logprobs_matches_equal_ids_in_order() -> None:
    got = align_logprobs(np.array([7, 1, 2, 3, 9]), np.array([0, 1, 1, 1, 1]), np.array([1, 5, 3, 9]),
                         np.array([-1.0, -2.0, -3.0, -4.0]))
    np.testing.assert_array_equal(got, [0.0, -1.0, np.nan, -3.0, -4.0])


def test_grpo_step_reports_the_trainer_engine_logprob_gap() -> None:
    """Engine logprobs = the trainer's own + 0.25 -> ``drift_logp_abs_diff`` 0.25; retokenized rows don't count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=0))
    rng = np.random.default_rng(0)
    mask = np.array([0, 0, 0, 1, 1, 1], dtype=np.uint8)
    samples = []
    for i in range(4):
        ids = rng.integers(1, 16, len(mask)).astype(np.int32)
        samples.append(Sample(f"r{i}", "g", ids, mask, np.zeros(len(mask), np.float32), reward=float(i % 2)))
    batch = collate(samples, np.zeros(len(samples)), pad_id=0)
    with torch.no_grad():
        trainer_B_T = token_logprobs(model, batch.input_ids, batch.attention_mask, positions_mask=batch.loss_mask > 0)
    for s, row_T in zip(samples, trainer_B_T.numpy(), strict=True):
        s.engine_logprobs = np.where(mask > 0, row_T + 0.25, 0.0).astype(np.float32)
    retok = Sample("r9", "g", samples[0].input_ids, mask, np.full(len(mask), np.nan, np.float32), reward=1.0,
                   exact=samples[0], aligned_logprobs=np.full(len(mask), np.nan, np.float32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = grpo_step(model, optimizer, [*samples, retok], GRPOConfig(group_size=2), pad_id=0)
    assert metrics["skipped"] == 0.0 and metrics["n_samples_used"] == 5
    assert metrics["drift_logp_abs_diff"] == pytest.approx(0.25, abs=1e-4)
    assert metrics["drift_sample_frac"] == 0.0 and metrics["drift_sequence_frac"] == 0.0  # same IDs
