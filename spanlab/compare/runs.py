"""Runs read back for a comparison: where a run's store is, which seed it ran with, what it scored per question.

A run is a run folder ``OUT/NAME/`` (its ``report.json`` names its store) or its store ``OUT/NAME.duckdb``; either
is accepted and the other found from it. Scores come from the store's held-out rollouts (``mode = 'test'``,
``metadata.phase`` and ``metadata.split``, a failed rollout scores 0), not from a report, so a comparison shows
what ran. The seed is the run's ``rollouts.seed``: its report's ``seed`` where the report has one, else found
from the store, whose rollouts carry the sampling seed the job derived from it
(:func:`spanlab.gateway.seeding.rollout_seed`); a run with neither was sampled unseeded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spanlab.compare.extra_ops import extra_ops_share
from spanlab.compare.table import held_out
from spanlab.errors import ConfigError
from spanlab.store import SpanStore, StoreAPI

logger = logging.getLogger(__name__)

STORE_SUFFIX = ".duckdb"
SEED_SEARCH = 10_000  # run seeds looked for in a store without a report: configs use small ones (0, 1, 2)


@dataclass(frozen=True)
class RunPaths:
    """A run's store, and its folder where there is one (a store copied alone has none)."""

    db: Path
    folder: Path | None


@dataclass(frozen=True)
class HeldOutScores:
    """One held-out evaluation (``phase``) of one run, per split: task_id -> reward, and the extra-operation
    share where the run recorded it."""

    label: str
    db: Path
    phase: str
    seed: int | None
    rewards: dict[str, dict[str, float]]
    extra_ops: dict[str, float] = field(default_factory=dict)


def _report_db(folder: Path) -> Path | None:
    """The store a finished run folder's report names (relative: the working directory's, or beside the folder)."""
    report = folder / "report.json"
    if not report.is_file():
        return None
    db = Path(json.loads(report.read_text())["db"])
    return next((c for c in (db, folder.parent / db.name) if c.is_file()), None)


def resolve_run(path: Path) -> RunPaths:
    """``path`` as a run: a store file (its folder beside it, when there), or a run folder (its store)."""
    if path.name.endswith(STORE_SUFFIX):
        folder = path.with_name(path.name.removesuffix(STORE_SUFFIX))
        if not path.is_file():
            raise ConfigError(f"{path}: no such store (did that run finish?)")
        return RunPaths(path, folder if folder.is_dir() else None)
    beside = path.with_name(path.name + STORE_SUFFIX)
    if path.is_dir():
        db = _report_db(path) or (beside if beside.is_file() else None)
        if db is None:
            raise ConfigError(f"{path}: a folder without its store ({beside.name} beside it, or report.json's db)")
        return RunPaths(db, path)
    if beside.is_file():
        return RunPaths(beside, None)
    raise ConfigError(f"{path}: no such run folder or store ({beside.name})")


def _seed_in_report(folder: Path | None) -> int | None:
    report = folder / "report.json" if folder is not None else None
    if report is None or not report.is_file():
        return None
    seed = json.loads(report.read_text()).get("seed")
    return None if seed is None else int(seed)


def _seed_in_store(store: StoreAPI, label: str) -> int | None:
    """The run seed whose derived sampling seeds the store's held-out rollouts carry (None: unseeded). A seeded
    run whose seed is not below :data:`SEED_SEARCH` is an error: it cannot be paired by seed unnamed."""
    from spanlab.gateway.seeding import SAMPLING_SEED, rollout_seed  # the gateway package: only when needed

    seeded = [r for r in store.rollout_summaries() if r.mode == "test" and SAMPLING_SEED in r.metadata][:3]
    for row in seeded:
        wanted = int(row.metadata[SAMPLING_SEED])
        for occurrence in (0, 1):  # a phase evaluated again after a resume counts up
            found = next((s for s in range(SEED_SEARCH)
                          if rollout_seed(s, row.mode, row.metadata, occurrence) == wanted), None)
            if found is not None:
                return found
    if seeded:
        raise ConfigError(f"{label}: its rollouts are seeded, but not by a seed below {SEED_SEARCH}; give the run "
                          "folder, whose report.json names it")
    return None


def evaluated_splits(store: StoreAPI, phase: str) -> list[str]:
    """The splits the held-out evaluation ``phase`` covered, in the order it ran them."""
    splits = [str(r.metadata.get("split")) for r in store.rollout_summaries(metadata={"phase": phase})
              if r.mode == "test" and r.metadata.get("split") is not None]
    return list(dict.fromkeys(splits))


def load_evaluation(path: Path, phase: str, splits: Sequence[str] | None = None, *,
                    label: str | None = None) -> HeldOutScores:
    """The held-out evaluation ``phase`` of the run at ``path`` on ``splits`` (None: every split it evaluated);
    a split it did not evaluate is an error naming the run."""
    run = resolve_run(path)
    name = label or (run.folder or run.db).name.removesuffix(STORE_SUFFIX)
    with SpanStore(run.db) as store:
        wanted = list(splits) if splits is not None else evaluated_splits(store, phase)
        if not wanted:
            raise ConfigError(f"{path}: no held-out evaluation of phase {phase!r}")
        rewards = {split: held_out(store, phase, split) for split in wanted}
        for split, by_task in rewards.items():
            if not by_task:
                raise ConfigError(f"{path}: no held-out rollouts of phase {phase!r} on split {split!r}")
        seed = _seed_in_report(run.folder)
        if seed is None:
            seed = _seed_in_store(store, str(path))
        shares = extra_ops_share(store, phase, wanted)
    logger.debug("%s: %s, seed %s, splits %s", path, run.db, seed, ", ".join(wanted))
    return HeldOutScores(name, run.db, phase, seed, rewards, shares)
