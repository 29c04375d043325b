"""Pooled splits: several held-out splits read as one (``--pool "levels 1-3=test+family"``).

A recipe's goal is often stated on a union (the demonstrated levels pooled over the by-question and the
by-wording split: 180 questions, a tighter interval than either half). Pooling before the comparison keeps the
pairing: a question stays paired with itself (its key names its split), and the bootstrap draws from the union.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from spanlab.compare.runs import HeldOutScores
from spanlab.errors import ConfigError


def parse_pools(specs: Sequence[str]) -> dict[str, list[str]]:
    """``NAME=SPLIT+SPLIT[+...]`` each -> {name: splits}; a malformed one is an error naming it."""
    pools: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        parts = [p.strip() for p in rest.split("+") if p.strip()]
        if not sep or not name.strip() or len(parts) < 2 or len(set(parts)) != len(parts):
            raise ConfigError(f"--pool {spec!r}: give NAME=SPLIT+SPLIT (two or more different splits)")
        if name.strip() in pools:
            raise ConfigError(f"--pool {name.strip()!r}: a pool of that name was given already")
        pools[name.strip()] = parts
    return pools


def with_pools(scores: HeldOutScores, pools: Mapping[str, Sequence[str]]) -> HeldOutScores:
    """``scores`` with each pool added as a split: its questions are its parts' (keyed ``split/task_id``), its
    extra-operation share the parts' weighted by their questions (absent unless every part has one)."""
    rewards, shares = dict(scores.rewards), dict(scores.extra_ops)
    for name, parts in pools.items():
        if name in rewards:
            raise ConfigError(f"--pool {name!r}: a split of that name exists; name the pool otherwise")
        if missing := [p for p in parts if p not in scores.rewards]:
            raise ConfigError(f"--pool {name!r}: {scores.label} did not evaluate {', '.join(missing)} "
                              f"(its splits: {', '.join(scores.rewards)})")
        rewards[name] = {f"{part}/{task}": r for part in parts for task, r in scores.rewards[part].items()}
        if all(p in scores.extra_ops for p in parts):
            counts = [len(scores.rewards[p]) for p in parts]
            shares[name] = sum(scores.extra_ops[p] * n for p, n in zip(parts, counts, strict=True)) / sum(counts)
    return replace(scores, rewards=rewards, extra_ops=shares)
