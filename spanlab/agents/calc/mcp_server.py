"""The calculator as a real MCP server over stdio: one tool, ``calculator(expression)``.

The expression is parsed with :mod:`ast` and only integer literals, ``+ - * /``, unary minus and
parentheses are evaluated (no ``eval``, no names, no ``**``), so a model cannot run code or build
huge numbers through it. The result is returned as text (``"85"``; a non-integer quotient as a
short decimal). A bad expression raises :class:`ToolError`, which MCP sends back as an ``isError``
result whose text says what was wrong, so the model sees the mistake instead of a crash.

Run: python -m spanlab.agents.calc.mcp_server   (speaks MCP on stdin/stdout; logs go to stderr)
"""

from __future__ import annotations

import ast
import logging
import operator
from collections.abc import Callable
from fractions import Fraction

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

logger = logging.getLogger(__name__)

TOOL_NAME = "calculator"
TOOL_DESCRIPTION = "Evaluate an arithmetic expression with integers, + - * / and parentheses."
MAX_EXPRESSION_CHARS = 200
MAX_ABS_VALUE = 10**12  # every intermediate result stays well inside a 64-bit int

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class CalculatorError(ValueError):
    """The expression is not plain integer arithmetic, or its value is undefined or too large."""


def _eval(node: ast.AST) -> Fraction:
    """Exact rational evaluation: a division that comes out whole stays an integer."""
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = Fraction(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _eval(node.operand)
        value = -inner if isinstance(node.op, ast.USub) else inner
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        value = _BINARY[type(node.op)](left, right)
    else:
        raise CalculatorError(f"unsupported element {ast.unparse(node)!r}: use integers, + - * / and parentheses")
    if abs(value) > MAX_ABS_VALUE:
        raise CalculatorError(f"a value exceeds {MAX_ABS_VALUE}")
    return value


def format_number(value: Fraction) -> str:
    """``85`` for whole numbers, else a decimal with at most 6 places (``2.5``, ``0.333333``)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def evaluate(expression: str) -> str:
    """The value of ``expression`` as text; raises :class:`CalculatorError` on anything else."""
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"cannot parse {expression!r}: {exc.msg}") from exc
    return format_number(_eval(tree))


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with integers, + - * / and parentheses."""
    try:
        return evaluate(expression)
    except CalculatorError as exc:
        raise ToolError(str(exc)) from exc


def build_server() -> MCPServer:
    """A fresh server holding the one tool (no module-level instance: nothing runs at import)."""
    server: MCPServer = MCPServer(name="spanlab-calculator", log_level="WARNING")
    server.add_tool(calculator, name=TOOL_NAME, description=TOOL_DESCRIPTION, structured_output=False)
    return server


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    build_server().run("stdio")


if __name__ == "__main__":
    main()
