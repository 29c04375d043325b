"""Per-turn credit on hand-made spans in real stores (SpanStore and StoreClient over HTTP, tests/stores.py).

Three roles of a SQL-style attempt: the writer's query ran (an intermediate reward), the checker's verdict matched
the real outcome (another), the rewrite fixed the query (a reward tied to the rewriter's call), then the runner's
final reward. The discounted returns, GRPO's per-role normalization, and the broadcast setting giving exactly
what the adapter and GRPO gave before credit existed (``iter_samples`` without ``credit``, ``sample_advantages``).
"""

from __future__ import annotations

import numpy as np
import pytest

from spanlab.adapters.credit import CreditConfig, discounted_return, turn_rewards
from spanlab.adapters.sample_reader import iter_samples
from spanlab.algos.grpo.advantages import group_advantages, sample_advantages, turn_advantages
from spanlab.algos.grpo.config import GRPOCredit, GRPOSection
from spanlab.store import StoreAPI
from spanlab.types import LLMCall, Span, reward_span
from tests.conftest import scripted_spans


@pytest.fixture
def store(any_store: StoreAPI) -> StoreAPI:
    return any_store


def _attempt(store: StoreAPI, task_id: str, steps: list[tuple[str, object]]) -> tuple[str, dict[str, list[str]]]:
    """One rollout whose spans are written in the order of ``steps``: ``("call", role)`` an LLM call of that
    role, ``("reward", value)`` an intermediate reward, ``("tied", value)`` a reward tied to the last call,
    ``("final", value)`` the final reward. Returns the rollout ID and each role's call span IDs, in order."""
    rollout = store.enqueue_one({"task_id": task_id})
    got = store.dequeue(worker_id="w")
    assert got is not None
    rid, aid = rollout.rollout_id, got[1].attempt_id
    spans, calls = scripted_spans(*got, steps, seed=int(rid[-6:], 16), n_prompt=4, n_resp=2)
    store.add_spans(spans)
    store.finish_attempt(aid, "succeeded")
    return rid, calls


SQL_ATTEMPT = [("call", "writer"), ("reward", 0.2), ("call", "checker"), ("reward", 0.5),
               ("call", "rewriter"), ("tied", 1.0), ("final", 1.0)]


@pytest.mark.parametrize(("discount", "expected"), [
    (0.5, {"writer": 0.2 + 0.5 * 0.5 + 0.25 * 1.0 + 0.125 * 1.0, "checker": 0.5 + 0.5 * 1.0 + 0.25 * 1.0,
           "rewriter": 1.0 + 0.5 * 1.0}),
    (1.0, {"writer": 2.7, "checker": 2.5, "rewriter": 2.0}),
])
def test_each_turn_gets_the_discounted_rewards_recorded_after_it(store: StoreAPI, discount: float,
                                                                 expected: dict[str, float]) -> None:
    rid, calls = _attempt(store, "t", SQL_ATTEMPT)
    credit = CreditConfig(mode="per_turn", discount=discount)
    turns = turn_rewards(store, [rid], credit)
    assert [t.role for t in turns] == ["writer", "checker", "rewriter"]
    assert [t.span_id for t in turns] == [calls[t.role][0] for t in turns]
    assert {t.role: t.reward for t in turns} == pytest.approx(expected, abs=1e-12)
    samples = list(iter_samples(store, [rid], credit=credit))  # the samples carry the same returns and roles
    assert {s.role: s.reward for s in samples} == pytest.approx(expected, abs=1e-12)
    broadcast = turn_rewards(store, [rid], CreditConfig())
    assert [t.reward for t in broadcast] == [1.0, 1.0, 1.0]  # the final reward, to every turn
    assert turn_rewards(store, [rid], credit, agents=["checker"])[0].role == "checker"


@pytest.mark.parametrize(("discount", "expected"), [
    (0.5, {"writer": 0.2 + 0.5 * 1.0, "checker": 0.5 + 0.5 * 1.0, "rewriter": 1.0 + 0.5 * 1.0}),
    (1.0, {"writer": 1.2, "checker": 1.5, "rewriter": 2.0}),
])
def test_scope_role_pays_each_turn_its_own_roles_rewards_and_the_final_one(store: StoreAPI, discount: float,
                                                                            expected: dict[str, float]) -> None:
    rid, _ = _attempt(store, "t", SQL_ATTEMPT)  # 0.2 follows the writer, 0.5 the checker, 1.0 is tied to the rewriter
    credit = CreditConfig(mode="per_turn", discount=discount, scope="role")
    assert {t.role: t.reward for t in turn_rewards(store, [rid], credit)} == pytest.approx(expected, abs=1e-12)
    assert {s.role: s.reward for s in iter_samples(store, [rid], credit=credit)} == pytest.approx(expected, abs=1e-12)
    # the role_summary view attributes the intermediate rewards the same way
    table = store.query("SELECT role, intermediate_reward_sum FROM role_summary").to_pydict()
    per_role = dict(zip(table["role"], table["intermediate_reward_sum"], strict=True))
    assert per_role == pytest.approx({"checker": 0.5, "rewriter": 1.0, "writer": 0.2})


def test_a_reward_tied_to_an_earlier_call_belongs_to_that_calls_role(store: StoreAPI) -> None:
    rollout = store.enqueue_one({"task_id": "t"})
    got = store.dequeue(worker_id="w")
    assert got is not None
    rid, aid = rollout.rollout_id, got[1].attempt_id
    spans, calls = scripted_spans(*got, [("call", "writer"), ("call", "checker")], n_prompt=4, n_resp=2)
    late = reward_span(rid, aid, 0.25, call_span_id=calls["writer"][0])  # recorded after the checker's call
    store.add_spans([*spans, late, reward_span(rid, aid, 1.0)])
    store.finish_attempt(aid, "succeeded")
    turns = turn_rewards(store, [rid], CreditConfig(mode="per_turn", scope="role"))
    assert {t.role: t.reward for t in turns} == {"writer": 1.25, "checker": 1.0}


def test_scope_needs_per_turn() -> None:
    with pytest.raises(ValueError, match="scope 'role' has no effect with mode 'broadcast'"):
        CreditConfig(scope="role")


def test_a_turn_after_the_last_reward_gets_zero_and_an_attempt_with_no_reward_is_skipped(store: StoreAPI) -> None:
    rid, _ = _attempt(store, "t", [("call", "writer"), ("reward", 0.7), ("call", "checker")])
    credit = CreditConfig(mode="per_turn", discount=0.9)
    assert {t.role: t.reward for t in turn_rewards(store, [rid], credit)} == {"writer": 0.7, "checker": 0.0}
    broadcast = turn_rewards(store, [rid], CreditConfig())  # the last reward not tied to a call counts as final
    assert [t.reward for t in broadcast] == [0.7, 0.7]
    bare, _ = _attempt(store, "u", [("call", "writer")])
    assert turn_rewards(store, [bare], credit) == [] and list(iter_samples(store, [bare], credit=credit)) == []


def test_a_tito_session_is_one_turn_placed_at_its_first_call(store: StoreAPI) -> None:
    rollout = store.enqueue_one({"task_id": "t"})
    got = store.dequeue(worker_id="w")
    assert got is not None
    rid, aid = rollout.rollout_id, got[1].attempt_id

    def tito(prompt: list[int], response: list[int], mask: list[int]) -> Span:
        return Span(rollout_id=rid, attempt_id=aid, name="chat", kind="llm_call", attributes={"agent": "writer"},
                    llm=LLMCall(model="m", prompt_token_ids=prompt, response_token_ids=response,
                                response_logprobs=[-0.1] * len(response), loss_mask=mask))

    first, second = tito([1, 2], [10], [0, 0, 1]), tito([1, 2, 10, 3], [11], [0, 0, 1, 0, 1])
    store.add_spans([first, reward_span(rid, aid, 0.4), second, reward_span(rid, aid, 1.0)])
    store.finish_attempt(aid, "succeeded")  # only a finished attempt is trained (adapters/trainable.py)
    (sample,) = iter_samples(store, [rid], credit=CreditConfig(mode="per_turn", discount=0.5))
    assert sample.span_ids == [first.span_id, second.span_id]
    assert sample.reward == pytest.approx(0.4 + 0.5 * 1.0)  # both rewards came after its first call


def test_discounted_return_weights_the_kth_later_reward_by_discount_to_the_k() -> None:
    assert discounted_return([], 0.9) == 0.0
    assert discounted_return([3.0], 0.1) == 3.0
    assert discounted_return([1.0, 2.0, 4.0], 0.5) == pytest.approx(1.0 + 1.0 + 1.0)


def _group_of_sql_attempts(store: StoreAPI) -> list[str]:
    """Four rollouts of one task, each writer -> checker -> (rewriter), with different intermediate rewards."""
    plans = [
        SQL_ATTEMPT,
        [("call", "writer"), ("reward", 0.0), ("call", "checker"), ("reward", 1.0), ("final", 0.0)],
        [("call", "writer"), ("reward", 0.2), ("call", "checker"), ("reward", 0.0), ("call", "rewriter"),
         ("tied", 0.3), ("call", "rewriter"), ("final", 0.0)],
        [("call", "writer"), ("reward", 0.2), ("call", "checker"), ("reward", 1.0), ("final", 1.0)],
    ]
    return [_attempt(store, "task-1", plan)[0] for plan in plans]


def test_per_turn_advantages_are_normalized_per_role_within_each_group(store: StoreAPI) -> None:
    rollout_ids = _group_of_sql_attempts(store)
    credit = GRPOCredit(mode="per_turn", discount=0.5)
    assert credit.normalization == "group_role"
    samples = list(iter_samples(store, rollout_ids, credit=credit))
    rewriter = [i for i, s in enumerate(samples) if s.role == "rewriter"]
    by_rollout = {rid: [samples[i].reward for i in rewriter if samples[i].rollout_id == rid] for rid in rollout_ids}
    assert by_rollout == {rollout_ids[0]: [1.5], rollout_ids[1]: [], rollout_ids[2]: [pytest.approx(0.3), 0.0],
                          rollout_ids[3]: []}  # rollout 3's two rewriter turns differ: two units
    adv_N = turn_advantages(samples, normalize=credit.normalization)
    for role in ("writer", "checker", "rewriter"):  # each role's turns against the same role's in the group
        idx = [i for i, s in enumerate(samples) if s.role == role]
        expected = group_advantages([samples[i].reward for i in idx], ["task-1"] * len(idx))
        np.testing.assert_array_equal(adv_N[idx], expected)
        assert abs(float(adv_N[idx].sum())) < 1e-5
    assert not np.allclose(adv_N, turn_advantages(samples, normalize="group"))  # pooled roles give others


def test_group_role_counts_a_rollout_once_per_role_and_can_flip_a_pooled_sign() -> None:
    from spanlab.adapters.samples import Sample

    def s(rollout: str, role: str, reward: float) -> Sample:
        ids = np.array([1, 2], dtype=np.int32)
        return Sample(rollout, "g", ids, np.array([0, 1], np.uint8), np.zeros(2, np.float32), reward, role=role)

    samples = [s("a", "w", 1.0), s("a", "w", 1.0), s("a", "w", 1.0), s("b", "w", 0.0), s("a", "c", 0.0),
               s("b", "c", 0.0)]
    adv = turn_advantages(samples, normalize="group_role")
    np.testing.assert_allclose(adv[:4], [0.7071063, 0.7071063, 0.7071063, -0.7071063], rtol=1e-6)
    assert adv[4:].tolist() == [0.0, 0.0]  # the checkers' returns are all equal: no signal
    # writers return more than checkers (every later reward adds up): pooled, the worse writer looks good
    flip = [s("a", "w", 2.0), s("b", "w", 1.5), s("a", "c", 1.0), s("b", "c", 0.0)]
    assert turn_advantages(flip, normalize="group")[1] > 0 > turn_advantages(flip, normalize="group_role")[1]


@pytest.mark.parametrize("scale", [True, False])
def test_broadcast_reproduces_the_adapter_and_advantages_of_before_exactly(store: StoreAPI, scale: bool) -> None:
    rollout_ids = _group_of_sql_attempts(store) + [_attempt(store, "task-2", plan)[0] for plan in (
        [("call", "writer"), ("final", 1.0)], [("call", "writer"), ("call", "writer"), ("final", 0.0)])]
    before = list(iter_samples(store, rollout_ids))  # what GRPO read before credit existed
    before_adv = sample_advantages(before, scale=scale)
    config = GRPOSection()  # the default: broadcast, normalized per group
    assert config.credit == GRPOCredit(mode="broadcast", discount=1.0) and config.credit.normalization == "group"
    now = list(iter_samples(store, rollout_ids, credit=config.credit))
    now_adv = turn_advantages(now, scale=scale, normalize=config.credit.normalization)
    assert [(s.rollout_id, s.group_id, s.span_ids, s.reward) for s in now] == \
        [(s.rollout_id, s.group_id, s.span_ids, s.reward) for s in before]
    for a, b in zip(now, before, strict=True):
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.loss_mask, b.loss_mask)
        assert np.array_equal(a.engine_logprobs, b.engine_logprobs, equal_nan=True)
    assert now_adv.dtype == before_adv.dtype and np.array_equal(now_adv, before_adv)  # bit for bit
    assert np.count_nonzero(before_adv) > 0  # the comparison has signal to lose


def test_per_turn_credit_refuses_the_per_call_reward_mode(store: StoreAPI) -> None:
    rid, _ = _attempt(store, "t", SQL_ATTEMPT)
    with pytest.raises(ValueError, match=r"per_turn.*leave reward='final'"):
        list(iter_samples(store, [rid], reward="per_call", credit=CreditConfig(mode="per_turn")))
