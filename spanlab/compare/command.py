"""``spanlab compare``: arms of runs (one run per seed) against a shared start, per held-out split.

    spanlab compare --start runs/calc-ws --arm main runs/main-s0 runs/main-s1 runs/main-s2 \\
        --arm lora runs/lora-s0 runs/lora-s1 runs/lora-s2 --out compare.md --json compare.json

Prints, per split: each run's gain over the start (its final accuracy minus the start's, question by question),
each arm's mean gain with an interval over seeds and questions, each arm against the reference arm (the first,
or ``--reference``) paired by seed and question, the extra-operation share, and a one-line verdict. The arms
are read from their stores alone (:mod:`spanlab.compare.runs`). Left out: runs with different question sets (an
error), and any correction for comparing many arms at once (each verdict is one 95% interval).

``--arm NAME RUN [RUN ...]`` repeats with a variable number of values, which typer's options cannot express: the
``spanlab compare`` command declares it (for its help and the docs) and reads the groups from its raw arguments
(:func:`arm_groups`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from spanlab.compare.gains import Run, Settings, check_arms, compare_split
from spanlab.compare.pools import parse_pools, with_pools
from spanlab.compare.render import ArmSummary, Comparison, markdown
from spanlab.compare.runs import HeldOutScores, load_evaluation
from spanlab.errors import ConfigError

logger = logging.getLogger(__name__)

StartPhase = Literal["warm_start", "base"]


def compare(start: HeldOutScores, arms: Mapping[str, Sequence[HeldOutScores]], *, reference: str | None = None,
            settings: Settings | None = None) -> Comparison:
    """Every arm's runs against ``start`` on the start's splits (every run must have evaluated them), and every
    other arm against ``reference`` (default: the first arm; none with one arm)."""
    settings = settings or Settings()
    if reference is not None and reference not in arms:
        raise ConfigError(f"--reference {reference!r}: no arm of that name (arms: {', '.join(arms)})")
    if reference is None and len(arms) > 1:
        reference = next(iter(arms))
    runs = {name: [Run(final, start) for final in finals] for name, finals in arms.items()}
    check_arms(runs)
    splits = [compare_split(runs, split, reference, settings) for split in start.rewards]
    return Comparison(start=start.label, start_phase=start.phase, reference=reference,
                      arms=[ArmSummary(arm=name, runs=[r.label for r in finals], seeds=[r.seed for r in finals])
                            for name, finals in arms.items()],
                      splits=splits, level=settings.level, resamples=settings.resamples,
                      bootstrap_seed=settings.seed)


def arm_groups(args: Sequence[str]) -> dict[str, list[Path]]:
    """``--arm NAME RUN [RUN ...]``, repeated, read from the command's raw arguments: each ``--arm`` takes the
    words up to the next option. An arm without runs, or an arm named twice, is an error."""
    arms: dict[str, list[Path]] = {}
    current: list[str] | None = None
    for word in [*args, "--"]:
        if word.startswith("-"):
            if current is not None:
                if len(current) < 2:
                    raise ConfigError("--arm NAME RUN [RUN ...]: give each arm a name and at least one run")
                if current[0] in arms:
                    raise ConfigError(f"--arm {current[0]}: an arm of that name was given already")
                arms[current[0]] = [Path(run) for run in current[1:]]
            current = [] if word == "--arm" or word.startswith("--arm=") else None
            if current is not None and "=" in word:
                current.append(word.split("=", 1)[1])
        elif current is not None:
            current.append(word)
    if not arms:
        raise ConfigError("give at least one arm: --arm NAME RUN [RUN ...]")
    return arms


def run(start: Path, arms: Mapping[str, Sequence[Path]], *, start_phase: str = "warm_start",
        reference: str | None = None, splits: Sequence[str] | None = None, out: Path | None = None,
        json_path: Path | None = None, pools: Sequence[str] = ()) -> str:
    """Load the runs, compare, write ``out`` (markdown) and ``json_path``; returns the markdown. ``pools``:
    ``NAME=SPLIT+SPLIT`` each, compared as one more split (:mod:`spanlab.compare.pools`)."""
    pooled = parse_pools(pools)
    first = load_evaluation(start, start_phase, splits)
    loaded = {name: [with_pools(load_evaluation(path, "final", list(first.rewards)), pooled) for path in paths]
              for name, paths in arms.items()}
    first = with_pools(first, pooled)
    result = compare(first, loaded, reference=reference)
    text = markdown(result)
    for path, content in ((out, text), (json_path, result.model_dump_json(indent=2) + "\n")):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            logger.info("wrote %s", path)
    return text
