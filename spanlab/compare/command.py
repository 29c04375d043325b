"""``spanlab compare``: arms of runs (one run per seed) against a shared start, per held-out split.

    spanlab compare --start runs/calc-ws --arm main runs/main-s0 runs/main-s1 runs/main-s2 \\
        --arm lora runs/lora-s0 runs/lora-s1 runs/lora-s2 --out compare.md --json compare.json

Prints, per split: each run's gain over the start (its final accuracy minus the start's, question by question),
each arm's mean gain with an interval over seeds and questions, each arm against the reference arm (the first,
or ``--reference``) paired by seed and question, the extra-operation share, and a one-line verdict. The arms
are read from their stores alone (:mod:`spanlab.compare.runs`). Left out: runs with different question sets (an
error), and any correction for comparing many arms at once (each verdict is one 95% interval).

The options are parsed here with argparse, since ``--arm NAME RUN [RUN ...]`` repeats with a variable number of
values, which the ``spanlab`` command's own parser (typer) cannot express.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from spanlab.compare.gains import Run, Settings, check_arms, compare_split
from spanlab.compare.render import ArmSummary, Comparison, markdown
from spanlab.compare.runs import Evaluation, load_evaluation
from spanlab.errors import ConfigError

logger = logging.getLogger(__name__)

START_PHASES = ("warm_start", "base")


def compare(start: Evaluation, arms: Mapping[str, Sequence[Evaluation]], *, reference: str | None = None,
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spanlab compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", type=Path, required=True, help="the shared start: a run folder or its .duckdb store")
    p.add_argument("--start-phase", default="warm_start", choices=START_PHASES,
                   help="the start's held-out evaluation (base: a run that evaluated its start model itself)")
    p.add_argument("--arm", nargs="+", action="append", required=True, metavar=("NAME", "RUN"),
                   help="an arm's name, then its runs (one per seed; run folders or stores); repeat per arm")
    p.add_argument("--reference", default=None, help="the arm the others are compared with (default: the first)")
    p.add_argument("--splits", default=None, help="comma-separated (default: every split the start evaluated)")
    p.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    p.add_argument("--json", type=Path, default=None, help="write the comparison as JSON here")
    return p


def run_command(argv: Sequence[str]) -> str:
    """Parse ``argv``, compare, write ``--out``/``--json``; returns the markdown. Bad runs raise ConfigError; bad
    options exit through argparse (status 2)."""
    p = parser()
    args = p.parse_args(list(argv))
    if any(len(group) < 2 for group in args.arm):
        p.error("--arm NAME RUN [RUN ...]: give each arm at least one run")
    names = [group[0] for group in args.arm]
    if len(set(names)) != len(names):
        p.error(f"--arm: an arm name given twice ({', '.join(n for n in names if names.count(n) > 1)})")
    splits = [s for s in args.splits.split(",") if s] if args.splits else None
    start = load_evaluation(args.start, args.start_phase, splits)
    arms = {group[0]: [load_evaluation(Path(run), "final", list(start.rewards)) for run in group[1:]]
            for group in args.arm}
    result = compare(start, arms, reference=args.reference)
    text = markdown(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        logger.info("wrote %s", args.out)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(result.model_dump_json(indent=2) + "\n")
        logger.info("wrote %s", args.json)
    return text
