"""GRPO's advantages: each sample's reward against its group's (and, per role, its role's) rewards.

Why its own module: the update (:mod:`.update`) needs only one array from here, and what a group is (a task's
rollouts; with per-turn credit, a task's turns of one role) is a question of its own. REFERENCE.md §6 has the
formulas.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.config import Normalization

__all__ = ["Normalization", "group_advantages", "sample_advantages", "turn_advantages"]


def group_advantages(
    rewards: Sequence[float] | np.ndarray, group_ids: Sequence[str], *, scale: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """``(r - mean_g) / (std_g + eps)`` per group (sample std, as TRL/verl); without ``scale``, ``r - mean_g``.

    A group whose rewards are all equal (or a group of one) gets exactly 0: it carries no signal.
    """
    rewards_N = np.asarray(rewards, dtype=np.float64)
    if rewards_N.shape != (len(group_ids),):
        raise ValueError(f"{rewards_N.shape[0]} rewards for {len(group_ids)} group ids")
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    adv_N = np.zeros_like(rewards_N)
    for idx in members.values():
        r_G = rewards_N[idx]
        if len(idx) < 2 or np.ptp(r_G) == 0:
            continue
        centered_G = r_G - r_G.mean()
        adv_N[idx] = centered_G / (r_G.std(ddof=1) + eps) if scale else centered_G
    return adv_N.astype(np.float32)


def sample_advantages(samples: Sequence[Sample], *, scale: bool = True) -> np.ndarray:
    """Advantages per sample, normalized over rollouts rather than calls.

    A rollout whose samples share one reward (the final reward of a multi-call rollout) counts once in
    its group's mean and std, so agents that make more calls do not weigh more; samples with their own
    (per-call) rewards count each.
    """
    rewards_by_rollout: dict[str, set[float]] = defaultdict(set)
    for s in samples:
        rewards_by_rollout[s.rollout_id].add(s.reward)
    keys_N = [s.rollout_id if len(rewards_by_rollout[s.rollout_id]) == 1 else f"{s.rollout_id}#{i}"
              for i, s in enumerate(samples)]
    unit_index = {k: i for i, k in reversed(list(enumerate(keys_N)))}  # first sample of each unit
    units_U = list(unit_index.values())
    adv_U = group_advantages([samples[i].reward for i in units_U], [samples[i].group_id for i in units_U], scale=scale)
    adv_by_key = {keys_N[i]: a for i, a in zip(units_U, adv_U, strict=True)}
    return np.array([adv_by_key[k] for k in keys_N], dtype=np.float32)


def turn_advantages(samples: Sequence[Sample], *, scale: bool = True,
                    normalize: Normalization = "group") -> np.ndarray:
    """Advantages per sample: ``group`` normalizes over each group's rollouts (:func:`sample_advantages`, what
    GRPO always did); ``group_role`` over each group's samples of one role (``Sample.role``) apart.

    Per role, because per-turn returns of different roles are on different scales (a writer's return sums the
    checker's and the rewriter's rewards after it, the last rewriter's is the final reward alone): pooled, the
    earlier roles would always look better than the later ones. Within a role, :func:`sample_advantages`'s rule
    holds: a rollout whose samples of that role share one reward counts once.
    """
    if normalize == "group":
        return sample_advantages(samples, scale=scale)
    if normalize != "group_role":
        raise ValueError(f"normalize must be 'group' or 'group_role', not {normalize!r}")
    members_by_role: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        members_by_role[s.role].append(i)
    adv_N = np.zeros(len(samples), dtype=np.float32)
    for idx in members_by_role.values():
        adv_N[idx] = sample_advantages([samples[i] for i in idx], scale=scale)
    return adv_N
