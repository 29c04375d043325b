"""Role demonstrations -> each role's SFT examples: the reward filter SFT uses, run once per role.

A task set that can mine its roles' demonstrations from recorded rollouts (the SQL agent's checker and rewriter,
:mod:`spanlab.agents.sql.mining`) hands over :class:`RoleDemonstration` conversations. Each is encoded with the
policy's chat template (the assistant turn is the trained part) and carries a reward (1.0: a demonstration is a
right answer by construction; a miner may keep recorded answers at the reward they earned). Per role they then go
through :func:`~spanlab.adapters.filtered_dataset.filter_samples`, the same high-reward filter SFT applies to
recorded calls (reward floor, exact-duplicate removal, ``max_len``), so what each role's warm start kept and
dropped is counted the way an SFT round counts it (``<role>/filter_*`` metrics).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spanlab.adapters.conversation import encode_conversation
from spanlab.adapters.filtered_dataset import FilterConfig, FilterStats, filter_samples
from spanlab.adapters.samples import Sample

__all__ = ["RoleDemonstration", "RoleSet", "role_sets"]


@dataclass(frozen=True)
class RoleDemonstration:
    """One conversation ending in the answer ``role`` should give; ``label`` says what kind (e.g. OK, WRONG)."""

    role: str
    messages: list[dict[str, Any]]
    task: dict[str, Any]
    label: str = ""
    reward: float = 1.0
    group_id: str = ""  # the filter's group (a task): top_frac and best_of_n rank within it
    span_ids: tuple[str, ...] = ()  # the recorded spans it was mined from
    tools: list[dict[str, Any]] | None = None


@dataclass
class RoleSet:
    """A role's kept demonstrations, each with its encoded sample (same order), and what the filter did."""

    demos: list[RoleDemonstration] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    stats: FilterStats = field(default_factory=FilterStats)

    def metrics(self, role: str) -> dict[str, float]:
        return {f"{role}/{k}": v for k, v in self.stats.metrics().items()}


def role_sets(demos: Sequence[RoleDemonstration], tokenizer: Any,
              config: FilterConfig | None = None) -> dict[str, RoleSet]:
    """Each role's demonstrations encoded and filtered (``config``: default, keep every right answer once), by
    role in first-seen order; a role whose every demonstration was dropped keeps an empty set."""
    config = config or FilterConfig()
    by_role: dict[str, list[tuple[Sample, RoleDemonstration]]] = {}
    for demo in demos:
        sample = encode_conversation(tokenizer, demo.messages, demo.tools)
        sample.reward, sample.group_id, sample.role = demo.reward, demo.group_id, demo.role
        sample.rollout_id, sample.span_ids = "", list(demo.span_ids)
        by_role.setdefault(demo.role, []).append((sample, demo))
    out: dict[str, RoleSet] = {}
    for role, pairs in by_role.items():
        demo_of = {id(s): d for s, d in pairs}
        kept, stats = filter_samples([s for s, _ in pairs], config)
        out[role] = RoleSet([demo_of[id(s)] for s, _ in kept], [s for s, _ in kept], stats)
    return out
