"""Comparing runs on their held-out questions: arms of seeded runs against a start (``spanlab compare``), and the
one-table view of single runs the compare tutorial prints (:mod:`spanlab.compare.table`)."""

from spanlab.compare.command import arm_groups, compare, run
from spanlab.compare.gains import Settings, paired_by_task, verdict
from spanlab.compare.render import Comparison, markdown
from spanlab.compare.runs import HeldOutScores, load_evaluation, resolve_run
from spanlab.compare.table import Arm, Row, SplitResult, build_table, failed_held_out, held_out, load_winner, measure

__all__ = [
           "Arm",
           "Comparison",
           "HeldOutScores",
           "Row",
           "Settings",
           "SplitResult",
           "arm_groups",
           "build_table",
           "compare",
           "failed_held_out",
           "held_out",
           "load_evaluation",
           "load_winner",
           "markdown",
           "measure",
           "paired_by_task",
           "resolve_run",
           "run",
           "verdict",
]
