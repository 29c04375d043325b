"""Experiments made of several ``spanlab train`` runs (stages): each its own config, store and run folder.

The tutorials' experiments (``tutorials/compare``, ``tutorials/drift``) train several times from one start.
Each stage is a plain config written to ``OUT/configs/NAME.yaml``, so a reader can rerun any one by hand with
``spanlab train``, and it runs in a subprocess, so every stage gets a fresh engine and frees its memory. A
stage that finished is reused, so an interrupted experiment continues where it stopped; one that stopped
half-way is continued with ``--resume`` where its algorithm can (GRPO saves its state after every step) and
started over, its leftovers moved aside, where it cannot (SFT rounds, APO): a half-run store would otherwise
add its rollouts to the next run's and hold two evaluations of one phase.

Why under tutorials/ and not in the package: only the tutorial scripts run experiments of stages. They put the
repo root on ``sys.path`` and import ``tutorials.stages``; the tests import it the same way.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import yaml

from spanlab.errors import ConfigError

logger = logging.getLogger(__name__)

StageState = Literal["done", "partial", "new"]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, mappings merged key by key (a copy; neither input changes)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def split_names(config: dict[str, Any]) -> tuple[str, ...]:
    """The held-out splits a train config evaluates, in its order: ``eval.split``, then each extra split's name."""
    section = config.get("eval") or {}
    extra = [s if isinstance(s, str) else s["name"] for s in section.get("extra_splits") or ()]
    return (section.get("split", "test"), *extra)


def from_checkpoint(config: dict[str, Any], model: Path, train_tasks: int) -> dict[str, Any]:
    """``config`` as a run that starts from ``model`` (the start's servable folder) instead of its own warm start:
    no warm start, the start's train tasks (``train_tasks``, :func:`start_train_tasks`), and GRPO's demonstration
    term drawing what the warm start demonstrated (its count and levels). Without those, a run with no warm start
    generates the term's demonstrations at every level of the dataset, the ones the warm start never showed too
    (the calc main job's level 4, which RL alone is meant to teach)."""
    out = copy.deepcopy(config)
    warm = out.pop("warm_start", None) or {}
    out["engine"] = {**out.get("engine", {}), "model": str(model)}
    out["dataset"] = {**out.get("dataset", {}), "train_tasks": train_tasks}
    term = (out.get("grpo") or {}).get("demonstrations")
    if isinstance(term, dict):
        shown = {key: warm[key] for key in ("demos", "levels") if warm.get(key) is not None}
        out["grpo"]["demonstrations"] = {**shown, **term}
    return out


def start_train_tasks(config: dict[str, Any]) -> int:
    """How many train tasks the run of ``config`` generates (its warm start's demonstrations need more than its
    algorithm alone): a run that starts from that run's folder without a warm start of its own must ask for as
    many (``dataset.train_tasks``), or it draws from a smaller, different pool."""
    from spanlab.jobs.config import parse_train_config
    from spanlab.jobs.job import build_algorithm, split_tasks
    from spanlab.jobs.tasks import load_task_set

    parsed = parse_train_config(config, "the start's config")
    splits = split_tasks(load_task_set(parsed.dataset.name), parsed, build_algorithm(parsed).train_tasks())
    return len(splits["train"])


def run_store(run_dir: Path) -> Path:
    """The store of the finished run in ``run_dir``: its report's ``db`` (relative paths are the working
    directory's, where ``spanlab train`` ran), else ``run_dir`` + ``.duckdb`` (the tutorials' layout)."""
    report = run_dir / "report.json"
    if not report.is_file():
        raise ConfigError(f"{run_dir}: no report.json (not a finished run folder)")
    db = Path(json.loads(report.read_text())["db"])
    for candidate in (db, run_dir.parent / db.name, run_dir.with_suffix(".duckdb")):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{run_dir}: its store {db} is not there (nor beside the run folder)")


def stage_state(out: Path, name: str) -> StageState:
    """``done``: the stage's run wrote its report; ``partial``: it left a store or run folder but no report."""
    run_dir, db = out / name, out / f"{name}.duckdb"
    if (run_dir / "report.json").is_file():  # written last, once the run has finished
        return "done"
    return "partial" if db.exists() or run_dir.exists() else "new"


def _move_aside(out: Path, name: str) -> Path:
    """The stopped stage's store (with its hot files) and run folder, moved to ``OUT/stopped/NAME-<time>/``."""
    where = out / "stopped" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    where.mkdir(parents=True)
    for path in [out / name, *out.glob(f"{name}.duckdb*")]:
        if path.exists():
            path.rename(where / path.name)
    return where


def run_stage(name: str, config: dict[str, Any], out: Path, *, resume: bool = False) -> float:
    """Run stage ``name`` with ``spanlab train`` in a subprocess (reused when it finished before); returns its
    wall seconds (a resumed stage: the seconds its report counts, over every part)."""
    run_dir, timing = out / name, out / name / "wall.json"
    state = stage_state(out, name)
    if state == "done":  # its wall time as measured here, or (killed before that was written) its report's
        seconds = float(json.loads((timing if timing.is_file() else run_dir / "report.json").read_text())["seconds"])
        logger.info("%s: reusing the finished run in %s (%.0f s when it ran)", name, run_dir, seconds)
        return seconds
    command = [sys.executable, "-m", "spanlab", "train", str(out / "configs" / f"{name}.yaml")]
    if state == "partial":
        if not resume:
            raise ConfigError(f"{name}: an earlier run of this stage stopped before its end ({run_dir}); pass "
                              "--resume to continue it, or delete it and its store to start it over")
        resumable = _resumable(config)
        if resumable and (run_dir / "resume").is_dir():
            command.append("--resume")
            logger.info("%s: continuing the stopped run from its last completed step", name)
        else:
            why = "it stopped before saving any state" if resumable else \
                f"algorithm {config.get('algorithm')} cannot continue a stopped run"
            logger.warning("%s: %s; starting it over (the stopped run's files are in %s)", name, why,
                           _move_aside(out, name))
    path = Path(command[4])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    logger.info("%s: %s (log: %s)", name, " ".join(command[2:]), log)
    root = str(Path(__file__).resolve().parents[1])  # the repo root: a config's relative paths (a template) are its
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    with log.open("a") as fh:
        done = subprocess.run(command, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise ConfigError(f"{name}: spanlab train exited with {done.returncode}; see {log} (rerun with --resume "
                          "to continue it)")
    if "--resume" in command:
        seconds = max(seconds, float(json.loads((run_dir / "report.json").read_text())["seconds"]))
    timing.write_text(json.dumps({"seconds": seconds}) + "\n")
    logger.info("%s: done in %.0f s", name, seconds)
    return seconds


def _resumable(config: dict[str, Any]) -> bool:
    from spanlab.jobs.registry import load_algorithm

    return load_algorithm(str(config.get("algorithm", "grpo"))).resumable
