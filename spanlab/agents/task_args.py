"""The argument checks every tutorial task set's ``make_tasks(split, n, seed, levels)`` shares.

Task sets are a contract (``spanlab.jobs.tasks``): the same arguments mean the same thing in each, so a
bad split, count or level gets the same error whichever set a config names.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

SPLITS = ("train", "val", "test")


def check_task_args(split: str, n: int, levels: Sequence[int], known_levels: Collection[int],
                    splits: Sequence[str] = SPLITS) -> None:
    """Raise ``ValueError`` naming the bad argument of a ``make_tasks`` call (``splits``: the set's own)."""
    if split not in splits:
        raise ValueError(f"split must be one of {tuple(splits)}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not levels or any(lv not in known_levels for lv in levels):
        raise ValueError(f"levels must be a non-empty subset of {tuple(sorted(known_levels))}, got {list(levels)}")
