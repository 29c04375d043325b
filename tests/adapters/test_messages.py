"""The messages adapter (what APO reads) on both store implementations: SpanStore and StoreClient to a server."""

from __future__ import annotations

from spanlab.adapters.messages import conversations, transcript
from spanlab.store import StoreAPI
from spanlab.types import LLMCall, RolloutConfig, Span, reward_span


def _call(rollout_id: str, attempt_id: str, question: str, answer: str, status: str = "ok") -> Span:
    return Span(rollout_id=rollout_id, attempt_id=attempt_id, name="chat", kind="llm_call", status=status,
                llm=LLMCall(model="m", request_messages=[{"role": "system", "content": "be brief"},
                                                         {"role": "user", "content": question}],
                            response_message={"role": "assistant", "content": answer}))


def test_conversations_read_the_last_attempts_last_ok_call_with_notes_and_reward(any_store: StoreAPI) -> None:
    store = any_store
    first = store.enqueue_one({"q": 1}, config=RolloutConfig(max_attempts=2))
    never_run = store.enqueue_one({"q": 2})
    rollout, failed = store.dequeue()
    store.finish_attempt(failed.attempt_id, "failed", [_call(rollout.rollout_id, failed.attempt_id, "1+1?", "3")])
    rollout, retry = store.dequeue()
    assert rollout.rollout_id == first.rollout_id
    rid, aid = rollout.rollout_id, retry.attempt_id
    store.add_spans([_call(rid, aid, "1+1?", "2"), _call(rid, aid, "again?", "oops", status="error"),
                     Span(rollout_id=rid, attempt_id=aid, name="grader", kind="custom", attributes={"ok": True})])
    store.finish_attempt(aid, "succeeded", [reward_span(rid, aid, 1.0)])

    got = conversations(store, [rid, never_run.rollout_id])
    conv = got[rid]
    assert conv.messages[-1] == {"role": "assistant", "content": "2"}  # not the failed attempt's, not the error
    assert conv.notes == {"grader": {"ok": True}} and conv.reward == 1.0
    assert transcript(conv) == "user: 1+1?\nassistant: 2"
    assert got[never_run.rollout_id].messages == [] and got[never_run.rollout_id].reward is None
