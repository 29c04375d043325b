"""GRPO's advantages: each sample's reward against its group's (and, per role, its role's) rewards.

Why its own module: the update (:mod:`.update`) needs only one array from here, and what a group is (a task's
rollouts; with per-turn credit, a task's turns of one role) is a question of its own. REFERENCE.md §6 has the
formulas.
Token-identical samples of a group whose advantages cancel carry no signal (:func:`cancel_identical`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from spanlab.adapters.samples import Sample
from spanlab.algos.grpo.config import Normalization

__all__ = ["Normalization", "cancel_identical", "group_advantages", "sample_advantages", "turn_advantages"]


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


def cancel_identical(samples: Sequence[Sample], adv_N: np.ndarray, *, rtol: float = 1e-6) -> np.ndarray:
    """``adv_N`` with 0 for every set of token-identical samples of one group and role whose advantages cancel.

    Why: identical samples share one gradient, so the update sees only the sum of their advantages. When a role's
    output did not vary within a group while the other roles' did (a writer that wrote the same SQL three times,
    then a checker that sometimes caught a problem), the rewards vary but that role's samples are one sequence:
    its advantages sum to zero, and the loss terms cancel to zero or to a float rounding residue. The step would
    then count the group as a signal, take an optimizer step that moves nothing (zero gradient) or, worse, that
    Adam's normalization turns a residue of 1e-9 into a full learning-rate step in a direction nobody chose.
    Zeroing them here makes such a group one with no signal, so the step skips it as it skips a group whose
    rewards are equal. A sum within ``rtol`` of the copies' summed magnitude is zero (float32 advantages).
    """
    copies: dict[tuple[str, str, bytes, bytes], list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        if adv_N[i] != 0:
            key = (s.group_id, s.role, np.asarray(s.input_ids, dtype=np.int64).tobytes(),
                   np.asarray(s.loss_mask, dtype=np.uint8).tobytes())
            copies[key].append(i)
    out_N = np.array(adv_N, dtype=np.float32, copy=True)
    for idx in copies.values():
        adv_C = out_N[idx].astype(np.float64)
        if len(idx) > 1 and abs(adv_C.sum()) <= rtol * np.abs(adv_C).sum():
            out_N[idx] = 0.0
    return out_N
