"""The compare table from one SQL query over the arms' DuckDB files (``gains.sql``), and its bar chart.

Each arm's store is ATTACHed read-only under its stage's name, so that one query reads every arm at once: per
arm and held-out split, the accuracy at the start and the end, the paired gain with its interval, and the
extra-operation share. ``run.py`` calls this at its end; on its own, from the repo root:

    PYTHONPATH=. .venv/bin/python tutorials/compare/gains.py --out runs/compare

Writes ``OUT/gains.md`` (the query's rows) and ``OUT/gains.png`` (one bar per arm and split: the paired gain,
with its interval as the error bar).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb

from spanlab.errors import ConfigError
from spanlab.store import SpanStore

logger = logging.getLogger("compare.gains")

QUERY = Path(__file__).resolve().parent / "gains.sql"
ALIASES = {"start": "start", "grpo": "grpo", "sft": "sft", "apo": "apo", "apo-grpo": "apo_grpo"}  # stage: alias
COLUMNS = ("arm", "split", "n", "start_pct", "end_pct", "gain", "gain_low", "gain_high", "start_extra_ops_pct",
           "extra_ops_pct", "training_rollouts")


def gains(stores: Mapping[str, Path]) -> list[dict[str, Any]]:
    """The rows of ``gains.sql`` over ``stores`` (stage name -> store file; every stage of :data:`ALIASES`)."""
    if missing := [name for name in ALIASES if not Path(stores.get(name, "")).is_file()]:
        raise ConfigError(f"no store for {', '.join(missing)} (have those stages run?); the query reads all of "
                          f"{', '.join(ALIASES)}")
    con = duckdb.connect()
    try:
        for name, alias in ALIASES.items():
            with SpanStore(stores[name]):  # copies in what a killed writer left in the hot file, as `spanlab sql`
                pass
            path = str(Path(stores[name]).resolve()).replace("'", "''")
            con.execute(f"ATTACH '{path}' AS {alias} (READ_ONLY)")
        result = con.execute(QUERY.read_text())
        names = [d[0] for d in result.description]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    except duckdb.Error as exc:
        raise ConfigError(f"{QUERY.name}: {exc}") from exc
    finally:
        con.close()


def _cell(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], out: Path, title: str = "") -> Path:
    """One bar chart, the arms side by side within each split: the paired gain over the start, in points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in dict.fromkeys(r["arm"] for r in rows) if a != "start"]
    splits = list(dict.fromkeys(r["split"] for r in rows))
    at = {(r["arm"], r["split"]): r for r in rows}
    width = 0.8 / max(len(arms), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(splits)), 4.2), dpi=100)
    for i, arm in enumerate(arms):
        xs = [j + (i - (len(arms) - 1) / 2) * width for j, s in enumerate(splits) if (arm, s) in at]
        got = [at[(arm, s)] for s in splits if (arm, s) in at]
        ys = [float(r["gain"]) for r in got]
        err = [[y - float(r["gain_low"]) for y, r in zip(ys, got, strict=True)],
               [float(r["gain_high"]) - y for y, r in zip(ys, got, strict=True)]]
        ax.bar(xs, ys, width=width, yerr=err, capsize=3, label=arm, color=f"C{i}")
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(f"{y:+.1f}", (x, y), ha="center", va="bottom" if y >= 0 else "top", fontsize=7)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(splits)), splits)
    ax.set_ylabel("paired gain over the start (points, 95% CI)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "each arm vs the common start, held-out splits", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def write(out: Path, title: str = "") -> str:
    """Run the query over ``OUT/NAME.duckdb``, write ``OUT/gains.md`` and ``OUT/gains.png``; returns the table."""
    rows = gains({name: out / f"{name}.duckdb" for name in ALIASES})
    table = markdown(rows)
    (out / "gains.md").write_text(table + "\n")
    logger.info("wrote %s and %s", out / "gains.md", plot(rows, out / "gains.png", title))
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/compare"), help="the comparison's folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        sys.stdout.write(write(args.out) + "\n")
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
