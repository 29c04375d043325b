"""What a trainable sample is: the one rule GRPO, SFT's filtering and APO's demonstrations read the store by.

Why one module: a trainer learns from whatever the adapter hands it, so a span that does not describe what
happened (a stream the agent abandoned, an attempt that crashed, an intermediate verdict read as the outcome)
must be left out in one place, the same way for every algorithm. The rule:

1. **Calls**: only ``llm_call`` spans with status ``ok``. A call that failed or that the agent abandoned
   (``client_disconnected``: a truncated response, recorded after the retry that replaced it) is never trained.
2. **Attempts**: only each rollout's last attempt, and only when it finished (``succeeded``). A ``failed``,
   ``timeout`` or ``unresponsive`` attempt (a cancelled rollout's attempt ends ``failed``) is dropped, unless
   ``failed_attempts: {reward: R}`` keeps it: then every sample of it trains on ``R``, whatever rewards it
   recorded before it stopped. An attempt still ``preparing`` or ``running`` is never trained.
3. **The final reward**: the attempt's last reward span marked ``attributes.final: true`` (the runner marks the
   reward the agent returns; ``ctx.add_reward`` marks its intermediate rewards ``final: false``). A reward span
   without the marker (a store written before it, or a span a program wrote itself) is read as before: the
   attempt's last unmarked reward tied to no call (``call_span_id``) is its final reward when no reward of the
   attempt is marked final. A reward marked ``false`` is never final. A reward that reached the store after its
   attempt had ended (a timed-out attempt whose agent finished late: marked ``attributes.late: true`` by the
   store) is kept for the record and is never read at all: not final, not a per-call reward.
   ``rollout_summary.final_reward``, ``role_summary``, APO's rollout rewards and the UI read the same rule
   (:data:`spanlab.store.schema.FINAL_REWARD_SQL`).

Every drop is counted (:class:`Dropped`, each step's ``dropped_*`` metrics) and a group that lost most of its
rollouts says so in the log.

    dropped = Dropped(); samples = list(iter_samples(store, ids, dropped=dropped)); dropped.metrics()
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spanlab.types import LATE_ATTRIBUTE

if TYPE_CHECKING:
    from spanlab.store.base import StoreAPI

__all__ = ["FINAL_ATTRIBUTE", "AttemptRewards", "AttemptVerdict", "Dropped", "FailedAttempts", "GroupLosses",
           "KeepFailed", "Selection", "attempt_verdict", "final_index", "final_mark", "final_rewards",
           "is_late", "select_attempts", "trainable_call", "trainable_rollouts"]

logger = logging.getLogger(__name__)

FINAL_ATTRIBUTE = "final"  # a reward span's ``attributes.final``: true (the attempt's outcome) or false
TRAINABLE_CALL_STATUS = "ok"



class KeepFailed(BaseModel):
    """``failed_attempts: {reward: R}``: train failed and timed-out attempts' calls, each on reward ``R``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reward: float = Field(allow_inf_nan=False, description="the reward every sample of such an attempt trains on")


FailedAttempts = Literal["drop"] | KeepFailed
AttemptVerdict = Literal["train", "keep_failed", "failed", "unfinished"]
_FAILED = frozenset({"failed", "timeout", "unresponsive"})


def trainable_call(status: str | None) -> bool:
    """Rule 1: an ``llm_call`` span is trained only when its status is ``ok``."""
    return status == TRAINABLE_CALL_STATUS


def attempt_verdict(status: str, failed_attempts: FailedAttempts = "drop") -> AttemptVerdict:
    """Rule 2 for one (last) attempt: ``train``, ``keep_failed`` (trained on the configured reward), or why not."""
    if status == "succeeded":
        return "train"
    if status in _FAILED:
        return "failed" if failed_attempts == "drop" else "keep_failed"
    return "unfinished"


def final_mark(attributes: str | Mapping[str, Any] | None) -> bool | None:
    """A reward span's marker: True (final), False (intermediate) or None (unmarked; a non-boolean is unmarked)."""
    attrs = json.loads(attributes) if isinstance(attributes, str) else attributes
    mark = attrs.get(FINAL_ATTRIBUTE) if isinstance(attrs, Mapping) else None
    return mark if isinstance(mark, bool) else None


def is_late(attributes: str | Mapping[str, Any] | None) -> bool:
    """Whether a reward span reached the store after its attempt had ended (:data:`~spanlab.types.LATE_ATTRIBUTE`)."""
    attrs = json.loads(attributes) if isinstance(attributes, str) else attributes
    return isinstance(attrs, Mapping) and attrs.get(LATE_ATTRIBUTE) is True


def final_index(marks: Sequence[bool | None], tied: Sequence[str | None]) -> int | None:
    """Rule 3: the position of an attempt's final reward among its reward spans (in sequence order), if any."""
    marked = [i for i, m in enumerate(marks) if m is True]
    if marked:
        return marked[-1]
    unmarked = [i for i, (m, call) in enumerate(zip(marks, tied, strict=True)) if m is None and call is None]
    return unmarked[-1] if unmarked else None


@dataclass
class AttemptRewards:
    """The rewards of some attempts as the rule reads them: each one's final reward (rule 3), and the last reward
    tied to each call (``reward="per_call"``)."""

    final: dict[str, float]  # attempt_id -> final reward
    per_call: dict[str, float]  # llm call span_id -> its last tied reward
    per_call_attempts: set[str]  # attempts with at least one tied reward

    @classmethod
    def read(cls, store: StoreAPI, attempt_ids: Sequence[str]) -> AttemptRewards:
        """One typed span read of the attempts' reward spans (any store)."""
        rewards = cls({}, {}, set())
        if not attempt_ids:
            return rewards
        cols = ("attempt_id", "reward_call_span_id", "reward_value", "attributes")
        tbl = store.spans_table(attempt_ids=list(attempt_ids), kinds=["reward"], columns=list(cols))  # in order
        by_attempt: dict[str, list[tuple[str | None, float, bool | None]]] = defaultdict(list)
        for aid, call_id, value, text in zip(*(tbl[c].to_pylist() for c in cols), strict=True):
            attrs = json.loads(text) if isinstance(text, str) else text  # parsed once for both marks
            if is_late(attrs):
                continue
            by_attempt[aid].append((call_id, float(value), final_mark(attrs)))
            if call_id is not None:
                rewards.per_call[call_id] = float(value)
                rewards.per_call_attempts.add(aid)
        for aid, rows in by_attempt.items():
            i = final_index([mark for _, _, mark in rows], [call_id for call_id, _, _ in rows])
            if i is not None:
                rewards.final[aid] = rows[i][1]
        return rewards


def final_rewards(store: StoreAPI, attempt_ids: Sequence[str]) -> dict[str, float]:
    """``attempt_id -> final reward`` of the given attempts (absent: none), by rule 3."""
    return AttemptRewards.read(store, attempt_ids).final


def trainable_rollouts(store: StoreAPI, rollout_ids: Sequence[str]) -> set[str]:
    """The rollouts whose last attempt finished with a final reward (rules 2 and 3, failed attempts dropped): what
    an algorithm that learns from whole rollouts (APO's demonstrations) may take as an example."""
    attempts = {a.attempt_id: r.rollout_id for r, a in store.last_attempts(list(dict.fromkeys(rollout_ids)))
                if attempt_verdict(a.status) == "train"}
    return {attempts[aid] for aid in final_rewards(store, list(attempts))}


DropReason = Literal["failed_attempt", "unfinished_attempt", "unrewarded_attempt", "no_samples"]


@dataclass
class Dropped:
    """What reads left out, and why; counts add up over the reads given the same object (one per step).

    ``error_spans``: calls not ``ok`` of attempts otherwise trained; ``failed_attempts``: failed, timed-out or
    unresponsive last attempts (dropped); ``unfinished_attempts``: still running; ``unrewarded_attempts``:
    finished without the reward the read asks for; ``no_attempt``: rollouts never dequeued; ``empty_samples``:
    calls or sessions with no sampled token, or (``reward="per_call"``) no reward. ``kept_failed_attempts`` is
    not a drop: the failed attempts ``failed_attempts: {reward: R}`` kept.
    """

    error_spans: int = 0
    failed_attempts: int = 0
    unfinished_attempts: int = 0
    unrewarded_attempts: int = 0
    no_attempt: int = 0
    empty_samples: int = 0
    kept_failed_attempts: int = 0

    def metrics(self) -> dict[str, float]:
        """One flat dict for a step's metrics: ``dropped_<why>`` and ``kept_failed_attempts``."""
        return {(k if k.startswith("kept_") else f"dropped_{k}"): float(v) for k, v in vars(self).items()}


@dataclass
class GroupLosses:
    """One read's rollouts that gave no sample, per advantage group and reason, counted into ``dropped`` too."""

    dropped: Dropped
    lost: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def lose(self, group_id: str, reason: DropReason) -> None:
        self.lost[group_id][reason] += 1
        if reason != "no_samples":  # its calls are already counted (error_spans, empty_samples)
            attr = f"{reason}s"
            setattr(self.dropped, attr, getattr(self.dropped, attr) + 1)

    def warn(self, group_sizes: Mapping[str, int]) -> None:
        """A WARNING for each group that lost more than half of its rollouts (``group_sizes``: rollouts read)."""
        for group_id, reasons in sorted(self.lost.items()):
            lost, size = sum(reasons.values()), group_sizes.get(group_id, 0)
            if size and lost * 2 > size:
                why = ", ".join(f"{reason.replace('_', ' ')}: {n}" for reason, n in sorted(reasons.items()))
                logger.warning("group %s: %d of its %d rollouts give no sample (%s); its advantages compare the "
                               "%d left", group_id, lost, size, why, size - lost)


@dataclass
class Selection:
    """Rule 2 applied to last attempts: those trained on what they recorded, and the failed ones kept."""

    finished: list[str]  # attempt_ids that succeeded
    fixed: dict[str, float]  # attempt_id -> the reward a kept failed attempt trains on


def select_attempts(attempts: Mapping[str, tuple[str, str]], failed_attempts: FailedAttempts,
                    losses: GroupLosses) -> Selection:
    """``attempts``: ``attempt_id -> (group_id, status)``; the ones left out are counted in ``losses``."""
    selection = Selection([], {})
    for aid, (group_id, status) in attempts.items():
        verdict = attempt_verdict(status, failed_attempts)
        if verdict == "train":
            selection.finished.append(aid)
        elif verdict == "keep_failed" and not isinstance(failed_attempts, str):
            selection.fixed[aid] = failed_attempts.reward
            losses.dropped.kept_failed_attempts += 1
        else:
            losses.lose(group_id, "failed_attempt" if verdict == "failed" else "unfinished_attempt")
    return selection
