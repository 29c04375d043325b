"""Does an answer's calculator expression use more operations than its problem needs? (``calc.extra_ops``)

Why: RL that rewards a new skill needing one more operation can teach a habit instead, appending an operation
to a correct one-step expression (``5 * 7 + 5 * 7`` for ``5 * 7``) wherever a wording is unfamiliar. Held-out
accuracy shows that only as a few lost points; this metric shows the habit itself, per split, in every run.

Definitions. An expression's *operations* are its binary operations (``+ - * /``, the ``BinOp`` nodes of its
:mod:`ast`): ``23 + 4 * 6`` has two, ``-5 + 3`` one (a unary minus is a sign, not an operation), and
parentheses add none. The problem needs as many as its task's own ``expression`` holds (level 1 and 2: one,
level 3: two, level 4: three). An answer's expression is the *last* calculator call whose expression the
calculator could evaluate: the one whose result the answer reports (an earlier call with an extra operation
that the model then corrected does not count; a call the calculator rejected returned no result). A rollout
that made no such call records no value, so the metric's mean is the share of calculator-using rollouts whose
expression has more operations than needed.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from typing import Any

from spanlab.agents.calc.mcp_server import evaluate

EXTRA_OPS_METRIC = "calc.extra_ops"


def count_operations(expression: str) -> int | None:
    """How many binary operations ``expression`` holds; None when it is not a Python-syntax expression."""
    text = expression.strip().replace("×", "*").replace("÷", "/")  # as the calculator reads it
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the text
        return None
    return sum(isinstance(node, ast.BinOp) for node in ast.walk(tree))


def call_expression(arguments: Any) -> str | None:
    """The ``expression`` argument of one calculator call (its arguments as JSON text or a dict), if any."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    value = arguments.get("expression") if isinstance(arguments, dict) else None
    return value if isinstance(value, str) else None


def _evaluates(expression: str) -> bool:
    try:
        evaluate(expression)
    except ValueError:  # CalculatorError, or a NUL byte the parser refuses
        return False
    return True


def extra_operations(expressions: Iterable[str], task: Mapping[str, Any]) -> float | None:
    """1.0 when the answer's expression (the last one the calculator evaluates) has more operations than
    ``task["expression"]``, 0.0 when not; None without such an expression or when the task has none."""
    needed = count_operations(str(task["expression"])) if task.get("expression") is not None else None
    used = next((count_operations(e) for e in reversed(list(expressions)) if _evaluates(e)), None)
    if needed is None or used is None:
        return None
    return float(used > needed)
