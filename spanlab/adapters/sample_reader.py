"""Spans -> training samples, streamed so memory stays bounded by one Arrow batch: what GRPO, SFT and the
per-role policies train on.

One ``Sample`` per LLM call (a per-call triplet: prompt + response, loss on the response), or one per
TITO session segment when the spans carry a session ``loss_mask`` over prompt + response: then each call
of a segment extends the previous one and only the last span is kept, with the engine logprobs of all
the segment's sampled turns put back at their positions. What is read is what :mod:`spanlab.adapters.trainable`
says is trainable: ``ok`` calls of each rollout's last attempt when it finished (a failed or timed-out one only
under ``failed_attempts={reward: R}``), and what was left out is counted in ``dropped``. Rewards: the attempt's
final reward (the reward span marked final: what the runner records and ``rollout_summary.final_reward`` reads),
or with ``reward="per_call"`` the last reward tied to a call (``call_span_id``), falling back to the final.
Rollouts with no reward are skipped with a log line.
A multi-agent attempt (calls made through ``ctx.agent_base_url(role)``, ``attributes.agent``) holds one
session per role; ``agents=[...]`` keeps only those roles' calls, so an algorithm trains the roles a
config selects and the others' calls never reach it. Every role's sample takes the attempt's reward, unless
``credit=CreditConfig(mode="per_turn")``: then each sample (a turn) takes the discounted return of the rewards
recorded after it (:mod:`spanlab.adapters.credit` defines it). ``Sample.role`` names the turn's role either way.
``token_source="retokenized"`` rebuilds every sample from the stored text instead, as text-only trainers
did (``spanlab.adapters.retokenize``: the drift experiment of issue #7); ``"exact"`` (default) is the above.

Left out: packing several sequences into one row (right padding only), token-level rewards inside a
session (a session sample takes the reward of its last rewarded call; with per-turn credit, the return from
its first call), truncating over-long samples.

    for s in iter_samples(store, rollout_ids): ...
    for chunk in micro_batches(samples, max_tokens=4096): batch = collate(chunk, advantages, pad_id)

``Sample``, ``Batch``, ``collate`` and ``micro_batches`` live in :mod:`spanlab.adapters.samples` (no store there),
and are imported from there only.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from spanlab.adapters.credit import CreditConfig, RewardTimeline, call_role
from spanlab.adapters.retokenize import Retokenizer, TokenSource, retokenize_samples
from spanlab.adapters.samples import Sample
from spanlab.adapters.trainable import (
    AttemptRewards,
    Dropped,
    FailedAttempts,
    GroupLosses,
    select_attempts,
    trainable_call,
)
from spanlab.store.base import StoreAPI

__all__ = ["RewardMode", "iter_samples"]

logger = logging.getLogger(__name__)

RewardMode = Literal["final", "per_call"]
_SPAN_COLUMNS = ("span_id", "rollout_id", "attempt_id", "status", "prompt_token_ids", "response_token_ids",
                 "response_logprobs", "loss_mask")


def iter_samples(
    store: StoreAPI,
    rollout_ids: Sequence[str],
    *,
    group_key: str | None = "task_id",
    reward: RewardMode = "final",
    batch_rows: int = 256,
    token_source: TokenSource = "exact",
    tokenizer: Any = None,
    chat_template: str | Path | None = None,
    agents: Sequence[str] | None = None,
    credit: CreditConfig | None = None,
    failed_attempts: FailedAttempts = "drop",
    dropped: Dropped | None = None,
) -> Iterator[Sample]:
    """Stream the samples of the given rollouts' last attempts, in rollout/attempt/call order.

    ``agents``: only calls of these roles of a multi-agent attempt (None: every call). Samples are grouped by
    ``input[group_key]``, else ``metadata.group_id`` (``group_key=None``: by ``metadata.group_id`` only).
    ``token_source="retokenized"`` needs the training-side ``tokenizer``; ``chat_template`` (a Jinja file)
    renders with another template than the tokenizer's, to model an inference/training stack mismatch.
    ``credit``: None or ``broadcast`` reads ``reward`` as above; ``per_turn`` gives each sample its return.
    ``failed_attempts``: ``"drop"`` or ``KeepFailed(reward=R)`` (:mod:`spanlab.adapters.trainable`, rule 2).
    ``dropped``: counts what was left out and why, added to across calls (read it once the iterator is spent).
    """
    if reward not in ("final", "per_call"):
        raise ValueError(f"reward must be 'final' or 'per_call', not {reward!r}")
    if credit is not None and credit.per_turn and reward != "final":
        raise ValueError("credit mode 'per_turn' reads every reward span by its position; leave reward='final'")
    if token_source == "retokenized":
        retokenizer = Retokenizer(tokenizer, chat_template)
        exact = _iter_exact(store, rollout_ids, group_key=group_key, reward=reward, batch_rows=batch_rows,
                            agents=agents, credit=credit, failed_attempts=failed_attempts, dropped=dropped)
        yield from retokenize_samples(store, exact, retokenizer, chunk=batch_rows)
        return
    if token_source != "exact" or chat_template is not None:
        raise ValueError(f"token_source must be 'exact' or 'retokenized', not {token_source!r}"
                         if token_source != "exact" else "chat_template is only used with token_source 'retokenized'")
    yield from _iter_exact(store, rollout_ids, group_key=group_key, reward=reward, batch_rows=batch_rows,
                           agents=agents, credit=credit, failed_attempts=failed_attempts, dropped=dropped)


def _iter_exact(store: StoreAPI, rollout_ids: Sequence[str], *, group_key: str | None, reward: RewardMode,
                batch_rows: int, agents: Sequence[str] | None = None, credit: CreditConfig | None = None,
                failed_attempts: FailedAttempts = "drop", dropped: Dropped | None = None) -> Iterator[Sample]:
    """The samples as the engine sampled them (the module docstring)."""
    dropped = dropped if dropped is not None else Dropped()
    rollout_ids = list(dict.fromkeys(rollout_ids))
    if not rollout_ids:
        return
    attempts = _last_attempts(store, rollout_ids, group_key)  # attempt_id -> its rollout, group and status
    group_sizes = Counter(a.group_id for a in attempts.values())
    losses = GroupLosses(dropped)
    never = sorted(set(rollout_ids) - {a.rollout_id for a in attempts.values()})
    dropped.no_attempt += len(never)
    selected = select_attempts({aid: (a.group_id, a.status) for aid, a in attempts.items()}, failed_attempts, losses)
    finished, fixed = selected.finished, selected.fixed  # fixed: kept failed attempts -> the configured reward
    rewards = AttemptRewards.read(store, finished)
    has_reward = rewards.final.keys() | (rewards.per_call_attempts if reward == "per_call" else set())
    timeline = None
    if credit is not None and credit.per_turn:
        timeline = RewardTimeline.read(store, finished, credit.discount)
        has_reward = timeline.rewarded()
    rewarded = {aid: attempts[aid].group_id for aid in [*finished, *fixed] if aid in has_reward or aid in fixed}
    for aid in finished:
        if aid not in rewarded:
            losses.lose(attempts[aid].group_id, "unrewarded_attempt")
    skipped = sorted({attempts[aid].rollout_id for aid in finished if aid not in rewarded} | set(never))
    if skipped:
        logger.info("skipping %d rollout(s) without a reward or an attempt: %s", len(skipped), ", ".join(skipped[:5]))
    if not rewarded:
        losses.warn(group_sizes)
        return
    roles, positions, calls = _call_agents(store, list(rewarded))  # span_id -> role (multi-agent), sequence_id
    if timeline is not None and credit is not None and credit.scope == "role":
        timeline = timeline.scoped_to_roles(calls)

    def reward_of(span_ids: list[str], attempt_id: str) -> float | None:
        if attempt_id in fixed:
            return fixed[attempt_id]
        if timeline is not None:  # a turn's position is its first call's
            return timeline.return_after(attempt_id, positions[span_ids[0]], roles.get(span_ids[0], ""))
        return _reward_of(span_ids, attempt_id, rewards, reward)

    wanted = None if agents is None else set(agents)
    reader = store.spans_reader(attempt_ids=list(rewarded), kinds=["llm_call"], columns=list(_SPAN_COLUMNS),
                                batch_size=batch_rows)
    sessions: dict[str, _Session] = {}  # the open TITO segment of each role of the current attempt
    gave: set[str] = set()  # attempts that gave a sample
    empty = Counter[str]()  # samples left out for want of sampled tokens or of a reward, per attempt

    def counted(sample: Sample | None, attempt_id: str) -> Iterator[Sample]:
        if sample is None:
            dropped.empty_samples += 1
            empty[attempt_id] += 1
            return
        gave.add(attempt_id)
        yield sample

    def finish(session: _Session) -> Iterator[Sample]:
        yield from counted(session.to_sample(reward_of(session.span_ids, session.attempt_id)), session.attempt_id)

    for call in _iter_calls(reader):
        role = roles.get(call.span_id, "")
        if wanted is not None and role not in wanted:
            continue
        if not trainable_call(call.status):  # rule 1: an abandoned or failed call is never trained
            dropped.error_spans += 1
            continue
        if sessions and next(iter(sessions.values())).attempt_id != call.attempt_id:
            for session in sessions.values():
                yield from finish(session)
            sessions.clear()
        session = sessions.get(role)
        if session is not None and not session.extended_by(call):
            yield from finish(sessions.pop(role))
            session = None
        group_id = rewarded[call.attempt_id]
        if call.loss_mask is not None:  # TITO: a session mask over prompt + response
            sessions[role] = session.extend(call) if session is not None else _Session.start(call, group_id, role)
        else:
            yield from counted(call.to_sample(group_id, reward_of([call.span_id], call.attempt_id), role),
                               call.attempt_id)
    for session in sessions.values():
        yield from finish(session)
    for aid, group_id in rewarded.items():
        if aid not in gave:
            losses.lose(group_id, "no_samples")
    if empty:
        logger.info("skipped %d sample(s) with no reward or no sampled tokens", empty.total())
    losses.warn(group_sizes)


# --- reading the store ---------------------------------------------------------------------------
def _group_id(input_json: str | None, metadata_json: str | None, group_key: str | None) -> str:
    """``input[group_key]`` (not when ``group_key`` is None), else ``metadata["group_id"]``, else the input itself
    as canonical JSON."""
    task: Any = json.loads(input_json) if input_json is not None else None
    meta: Any = json.loads(metadata_json) if metadata_json is not None else None
    if group_key is not None and isinstance(task, dict) and group_key in task:
        value = task[group_key]
    elif isinstance(meta, dict) and "group_id" in meta:
        value = meta["group_id"]
    else:
        value = task
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class _Attempt:
    rollout_id: str
    group_id: str
    status: str


def _last_attempts(store: StoreAPI, rollout_ids: list[str], group_key: str | None) -> dict[str, _Attempt]:
    return {a.attempt_id: _Attempt(r.rollout_id, _group_id(json.dumps(r.input), json.dumps(r.metadata), group_key),
                                   a.status)
            for r, a in store.last_attempts(rollout_ids)}


def _call_agents(store: StoreAPI, attempt_ids: list[str]) -> tuple[dict[str, str], dict[str, int], pa.Table]:
    """``span_id -> attributes.agent`` of the calls that name a role (none in a single-agent store),
    ``span_id -> sequence_id`` of every call (a turn's position, for per-turn credit), and the calls as read
    (what :meth:`RewardTimeline.scoped_to_roles` attributes rewards with)."""
    tbl = store.spans_table(attempt_ids=attempt_ids, kinds=["llm_call"],
                            columns=["attempt_id", "span_id", "sequence_id", "attributes"])
    span_ids = tbl["span_id"].to_pylist()
    agents = {sid: call_role(attrs) for sid, attrs in zip(span_ids, tbl["attributes"].to_pylist(), strict=True)}
    positions = dict(zip(span_ids, tbl["sequence_id"].to_pylist(), strict=True))
    return {sid: agent for sid, agent in agents.items() if agent}, positions, tbl


def _reward_of(span_ids: list[str], attempt_id: str, rewards: AttemptRewards, mode: RewardMode) -> float | None:
    if mode == "per_call":
        for sid in reversed(span_ids):
            if sid in rewards.per_call:
                return rewards.per_call[sid]
    return rewards.final.get(attempt_id)


@dataclass
class _Call:
    span_id: str
    rollout_id: str
    attempt_id: str
    status: str
    prompt: np.ndarray
    response: np.ndarray
    logprobs: np.ndarray | None
    loss_mask: np.ndarray | None

    def engine_logprobs(self, mask: np.ndarray) -> np.ndarray:
        """Logprobs over prompt + response: the response's where given, NaN on unexplained sampled tokens."""
        out = np.where(mask.astype(bool), np.float32(np.nan), np.float32(0.0)).astype(np.float32)
        if self.logprobs is not None:
            out[len(self.prompt):] = self.logprobs
        return out

    def to_sample(self, group_id: str, reward: float | None, role: str) -> Sample | None:
        if reward is None or len(self.response) == 0:
            return None
        ids = np.concatenate([self.prompt, self.response]).astype(np.int32)
        mask = np.zeros(len(ids), dtype=np.uint8)
        mask[len(self.prompt):] = 1
        return Sample(self.rollout_id, group_id, ids, mask, self.engine_logprobs(mask), reward, [self.span_id],
                      role=role)


@dataclass
class _Session:
    """The growing TITO segment of one attempt: the last span's tokens and mask, all its calls' logprobs."""

    attempt_id: str
    rollout_id: str
    group_id: str
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    span_ids: list[str]
    role: str

    @classmethod
    def start(cls, call: _Call, group_id: str, role: str) -> _Session:
        assert call.loss_mask is not None
        ids = np.concatenate([call.prompt, call.response]).astype(np.int32)
        return cls(call.attempt_id, call.rollout_id, group_id, ids, call.loss_mask.astype(np.uint8),
                   call.engine_logprobs(call.loss_mask), [call.span_id], role)

    def extended_by(self, call: _Call) -> bool:
        """Same segment: a session call whose prompt starts with everything this segment holds."""
        n = len(self.ids)
        return call.loss_mask is None or (len(call.prompt) >= n and np.array_equal(call.prompt[:n], self.ids))

    def extend(self, call: _Call) -> _Session:
        assert call.loss_mask is not None
        logprobs = call.engine_logprobs(call.loss_mask)  # this call's response; NaN on earlier sampled turns
        n = len(self.ids)
        known = call.loss_mask[:n].astype(bool) & self.mask.astype(bool)
        logprobs[:n][known] = self.logprobs[known]  # put back the earlier turns' logprobs
        self.ids = np.concatenate([call.prompt, call.response]).astype(np.int32)
        self.mask, self.logprobs = call.loss_mask.astype(np.uint8), logprobs
        self.span_ids.append(call.span_id)
        return self

    def to_sample(self, reward: float | None) -> Sample | None:
        if reward is None or not self.mask.any():
            return None
        return Sample(self.rollout_id, self.group_id, self.ids, self.mask, self.logprobs, reward, self.span_ids,
                      role=self.role)


def _list_column(batch: pa.RecordBatch, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values, offsets and null flags of a list column, without building Python lists."""
    col = batch.column(name)
    return (col.values.to_numpy(zero_copy_only=False), col.offsets.to_numpy(),
            col.is_null().to_numpy(zero_copy_only=False))


def _iter_calls(reader: pa.RecordBatchReader) -> Iterator[_Call]:
    for batch in reader:
        span_ids, rollout_ids, attempt_ids, statuses = (batch.column(c).to_pylist() for c in _SPAN_COLUMNS[:4])
        (pv, po, _), (rv, ro, _) = _list_column(batch, "prompt_token_ids"), _list_column(batch, "response_token_ids")
        (lv, lo, lnull), (mv, mo, mnull) = _list_column(batch, "response_logprobs"), _list_column(batch, "loss_mask")
        for i in range(batch.num_rows):
            prompt, response = pv[po[i]:po[i + 1]], rv[ro[i]:ro[i + 1]]
            mask = None if mnull[i] else mv[mo[i]:mo[i + 1]]
            if mask is not None and len(mask) != len(prompt) + len(response):
                mask = None  # not a session mask: train on the response as a per-call triplet
            yield _Call(span_ids[i], rollout_ids[i], attempt_ids[i], statuses[i], prompt, response,
                        None if lnull[i] else lv[lo[i]:lo[i + 1]].astype(np.float32), mask)
