"""Per-turn credit: the rewards of an attempt recorded after a turn, discounted, as that turn's reward.

Why: a multi-agent attempt (writer, checker, rewriter) records intermediate rewards as spans
(``ctx.add_reward``: "the checker's verdict matched the real outcome", "the rewrite fixed a failing query")
before its final reward. Broadcasting the final reward to every turn (``mode: broadcast``, the default and what
:func:`spanlab.adapters.sample_reader.iter_samples` did before this module) rewards the checker for the writer's query.
``mode: per_turn`` gives each turn only what followed it.

The return, precisely. A *turn* is one ``llm_call`` sample, or one TITO session sample (the calls of one role
that extend one token buffer); its *position* is the ``sequence_id`` of its first call (the store numbers an
attempt's spans in the order they were written, and the gateway writes a call before the agent sees its answer,
so a reward recorded after the answer always comes later). The rewards after a turn are the attempt's ``reward``
spans with a larger ``sequence_id`` (tied to a call or not, intermediate or final), ordered by ``sequence_id``:
``r_0, r_1, ..., r_{K-1}``. The turn's return is

    G = sum_{k=0}^{K-1} discount**k * r_k

so with ``discount: 1`` a turn gets the sum of every later reward, and the turn before the final reward gets it
undiscounted. A turn with no reward after it gets 0.0.

Which later rewards count (``scope``). ``attempt``: every one. ``role``: the attempt's final reward (the reward
span marked final, :mod:`spanlab.adapters.trainable`, as ``rollout_summary`` reads it) and the intermediate rewards
that *belong* to the turn's role. An intermediate reward belongs to the role of the call it names
(``call_span_id``), else to the role of the last call recorded before it, which is how the ``role_summary`` view
attributes it. Why: with
``attempt`` a writer's turn is also paid for the checker's verdict on its query, so a wrong draft that the
checker rightly rejects earns the writer more than a right one; with ``role`` each role is paid for its own
work and for the outcome. The exponent counts rewards, not calls: a role that
makes more calls does not discount its later rewards more. Only attempts with at least one reward span are read
(an attempt with none is skipped, as the broadcast mode skips one with no final reward), and only the calls and
attempts :mod:`spanlab.adapters.trainable` says are trainable.

Any algorithm reads per-turn rewards through here (or :func:`~spanlab.adapters.sample_reader.iter_samples` with
``credit=``), never with its own SQL: :func:`turn_rewards` gives each call's return without token tensors.

    credit = CreditConfig(mode="per_turn", discount=0.9)
    for t in turn_rewards(store, rollout_ids, credit): t.role, t.span_id, t.reward
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spanlab.adapters.trainable import (
    attempt_verdict,
    final_index,
    final_mark,
    final_rewards,
    is_late,
    trainable_call,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from spanlab.store.base import StoreAPI

__all__ = ["CreditConfig", "CreditMode", "CreditScope", "RewardTimeline", "TurnReward", "discounted_return",
           "turn_rewards"]

CreditMode = Literal["broadcast", "per_turn"]
CreditScope = Literal["attempt", "role"]


class CreditConfig(BaseModel):
    """Which reward a turn trains on: the attempt's final reward (``broadcast``) or its discounted return."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: CreditMode = Field(default="broadcast", description=(
        "broadcast: every turn takes the attempt's final reward; per_turn: the rewards recorded after it"))
    discount: float = Field(default=1.0, gt=0, le=1, description="per later reward, per_turn only (1 = no discount)")
    scope: CreditScope = Field(default="attempt", description=(
        "per_turn only: attempt = every later reward; role = the final reward and the later intermediate "
        "rewards of the turn's own role"))

    @model_validator(mode="after")
    def _settings_need_per_turn(self) -> CreditConfig:
        if self.mode == "broadcast" and self.discount != 1.0:
            raise ValueError(f"discount {self.discount} has no effect with mode 'broadcast'; set mode: per_turn")
        if self.mode == "broadcast" and self.scope != "attempt":
            raise ValueError(f"scope {self.scope!r} has no effect with mode 'broadcast'; set mode: per_turn")
        return self

    @property
    def per_turn(self) -> bool:
        return self.mode == "per_turn"


def discounted_return(rewards_K: Sequence[float], discount: float) -> float:
    """``sum_k discount**k * rewards_K[k]``, the first reward undiscounted (the module docstring)."""
    total, weight = 0.0, 1.0
    for r in rewards_K:
        total += weight * r
        weight *= discount
    return total


@dataclass
class RewardTimeline:
    """The reward spans of some attempts, each attempt's in ``sequence_id`` order, and the returns they give."""

    discount: float
    positions: dict[str, list[int]]  # attempt_id -> sequence_ids of its reward spans, ascending
    values: dict[str, list[float]]  # attempt_id -> their values, in the same order
    tied: dict[str, list[str | None]]  # attempt_id -> the call each reward names (reward_call_span_id), in order
    marks: dict[str, list[bool | None]]  # attempt_id -> each reward's ``attributes.final`` marker, in order
    owners: dict[str, list[str | None]] | None = None  # scope role: each reward's role (None: the final reward)

    @classmethod
    def read(cls, store: StoreAPI, attempt_ids: Sequence[str], discount: float) -> RewardTimeline:
        """The reward spans of ``attempt_ids`` (any store: the typed ``spans_table`` read)."""
        names = ("attempt_id", "sequence_id", "reward_value", "reward_call_span_id", "attributes")
        tbl = store.spans_table(attempt_ids=list(attempt_ids), kinds=["reward"], columns=list(names))
        positions: dict[str, list[int]] = defaultdict(list)
        values: dict[str, list[float]] = defaultdict(list)
        tied: dict[str, list[str | None]] = defaultdict(list)
        marks: dict[str, list[bool | None]] = defaultdict(list)
        for aid, seq, value, call_id, attrs in zip(*(tbl[c].to_pylist() for c in names), strict=True):  # in order
            if is_late(attrs):  # arrived after its attempt ended: kept for the record, never credit
                continue
            positions[aid].append(int(seq))
            values[aid].append(float(value))
            tied[aid].append(call_id)
            marks[aid].append(final_mark(attrs))
        return cls(discount, dict(positions), dict(values), dict(tied), dict(marks))

    def rewarded(self) -> set[str]:
        """Attempts with at least one reward span."""
        return set(self.positions)

    def scoped_to_roles(self, calls: pa.Table) -> RewardTimeline:
        """This timeline with each reward owned by a role (``scope: role``): None for an attempt's final reward
        (:func:`~spanlab.adapters.trainable.final_index`), else the role of the call it names, else of the last
        call before it ("" when no call precedes it). ``calls``: the attempts' ``llm_call`` spans (``attempt_id``,
        ``span_id``, ``sequence_id``, ``attributes``, in attempt and sequence order), as the caller has read them."""
        role_of: dict[str, str] = {}
        call_seqs: dict[str, list[int]] = defaultdict(list)
        call_roles: dict[str, list[str]] = defaultdict(list)
        cols = (calls[c].to_pylist() for c in ("attempt_id", "span_id", "sequence_id", "attributes"))
        for aid, sid, seq, attrs in zip(*cols, strict=True):
            role_of[sid] = call_role(attrs)
            call_seqs[aid].append(int(seq))
            call_roles[aid].append(role_of[sid])
        owners: dict[str, list[str | None]] = {}
        for aid, seqs in self.positions.items():
            final = final_index(self.marks[aid], self.tied[aid])
            row: list[str | None] = []
            for i, (seq, call_id) in enumerate(zip(seqs, self.tied[aid], strict=True)):
                if i == final:
                    row.append(None)
                elif call_id is not None and call_id in role_of:
                    row.append(role_of[call_id])
                else:
                    before = bisect.bisect_left(call_seqs[aid], seq)
                    row.append(call_roles[aid][before - 1] if before else "")
            owners[aid] = row
        return replace(self, owners=owners)

    def after(self, attempt_id: str, sequence_id: int, role: str | None = None) -> list[float]:
        """The attempt's rewards recorded after position ``sequence_id``, in order (scoped: ``role``'s only)."""
        seqs = self.positions.get(attempt_id, [])
        start = bisect.bisect_right(seqs, sequence_id)
        later = self.values.get(attempt_id, [])[start:]
        if self.owners is None:
            return later
        owners = self.owners[attempt_id][start:] if attempt_id in self.owners else []
        return [v for v, owner in zip(later, owners, strict=True) if owner is None or owner == (role or "")]

    def return_after(self, attempt_id: str, sequence_id: int, role: str | None = None) -> float:
        """The discounted return of a turn of ``role`` at ``sequence_id`` (0.0 when no reward follows it)."""
        return discounted_return(self.after(attempt_id, sequence_id, role), self.discount)


@dataclass(frozen=True)
class TurnReward:
    """One LLM call of a rewarded attempt and the reward it trains on under a :class:`CreditConfig`."""

    rollout_id: str
    attempt_id: str
    span_id: str
    sequence_id: int
    role: str  # ``attributes.agent``; "" for a single-agent call
    reward: float


def turn_rewards(store: StoreAPI, rollout_ids: Sequence[str], credit: CreditConfig,
                 *, agents: Sequence[str] | None = None) -> list[TurnReward]:
    """Each call of the rollouts' last attempts with its reward, in attempt and sequence order.

    ``broadcast``: the attempt's final reward (the reward span marked final, as ``rollout_summary`` reads it;
    attempts without one are left out). ``per_turn``: the call's discounted return. ``agents``: only these roles'
    calls. Only trainable calls of finished attempts (:mod:`spanlab.adapters.trainable`; failed ones dropped).
    A TITO session sample takes the reward of its first call
    (:func:`~spanlab.adapters.sample_reader.iter_samples` with ``credit=`` gives the samples themselves).
    """
    attempts = {a.attempt_id: r.rollout_id for r, a in store.last_attempts(list(dict.fromkeys(rollout_ids)))
                if attempt_verdict(a.status) == "train"}
    if not attempts:
        return []
    calls = store.spans_table(attempt_ids=list(attempts), kinds=["llm_call"],
                              columns=["attempt_id", "span_id", "sequence_id", "attributes", "status"])
    # per_turn reads every reward span's position, broadcast only each attempt's final reward
    timeline = RewardTimeline.read(store, list(attempts), credit.discount) if credit.per_turn else None
    if timeline is not None and credit.scope == "role":
        timeline = timeline.scoped_to_roles(calls)
    finals = {} if credit.per_turn else final_rewards(store, list(attempts))
    wanted = None if agents is None else set(agents)
    out = []
    cols = (calls[c].to_pylist() for c in ("attempt_id", "span_id", "sequence_id", "attributes", "status"))
    for aid, sid, seq, attrs, status in zip(*cols, strict=True):
        role = call_role(attrs)
        if (wanted is not None and role not in wanted) or not trainable_call(status):
            continue
        if timeline is not None:
            if aid in timeline.positions:  # rewarded
                out.append(TurnReward(attempts[aid], aid, sid, int(seq), role,
                                      timeline.return_after(aid, int(seq), role)))
        elif aid in finals:
            out.append(TurnReward(attempts[aid], aid, sid, int(seq), role, finals[aid]))
    return out


def call_role(attributes_json: str | None) -> str:
    """A call's role: ``attributes.agent`` ("" when it names none)."""
    attrs = json.loads(attributes_json) if attributes_json else {}
    agent = attrs.get("agent") if isinstance(attrs, dict) else None
    return agent if isinstance(agent, str) else ""
