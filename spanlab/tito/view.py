"""Human output of ``spanlab template check`` / ``fix``: a verdict line, a table, the divergence in context.

Kept out of the check module so the gateway can use the checks without rich. Template text is printed as
``rich.text.Text`` (never as markup): templates are full of ``[INST]``-like brackets rich would eat.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from spanlab.tito.templates import TemplateReport

_CONTEXT = 60  # characters shown on each side of a divergence


def print_verdict(report: TemplateReport, console: Console) -> None:
    """One line: preserving, not preserving (with where), or why the check could not run."""
    if report.error is not None:
        console.print(Text.assemble(("error: ", "bold red"), report.error), soft_wrap=True)
    elif not report.renders_tool_results:  # its renders may line up: the tool turn is simply dropped
        console.print(Text.assemble((f"{report.template}: ", "bold"),
                                    ("not usable for tool calls (it renders no tool result)", "bold red")),
                      soft_wrap=True)
    elif report.tool_append_prefix_preserving:
        console.print(Text.assemble((f"{report.template}: ", "bold"), ("tool appends are prefix-preserving", "green")),
                      soft_wrap=True)
    else:
        level = "token" if report.string_level and report.string_level.ok else "string"
        console.print(Text.assemble((f"{report.template}: ", "bold"),
                                    (f"tool appends are NOT prefix-preserving ({level} level)", "bold red")),
                      soft_wrap=True)


def _yes_no(value: bool, good: bool = True) -> Text:
    return Text("yes" if value else "no", style="green" if value == good else "red")


def print_report(report: TemplateReport, console: Console) -> None:
    """The verdict, then every field of the report a person needs to act on."""
    print_verdict(report, console)
    if report.error is not None or report.string_level is None:
        return
    string, token = report.string_level, report.token_level
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("string level", Text("prefix" if string.ok else f"diverges at character {string.first_mismatch}",
                                       style="green" if string.ok else "red"))
    if token is None:
        table.add_row("token level", Text("not checked (give --tokenizer DIR)", style="dim"))
    else:
        table.add_row("token level", Text(
            f"prefix ({len(token.ids_before)} -> {len(token.ids_after)} tokens)" if token.ok
            else f"diverges at token {token.first_mismatch}", style="green" if token.ok else "red"))
    table.add_row("renders tool calls", _yes_no(report.renders_tool_calls))
    table.add_row("renders tool results", _yes_no(report.renders_tool_results))
    table.add_row("needs a tools list", _yes_no(report.needs_tools, good=False))
    gap = "unknown" if report.stop_gap is None else f"{report.stop_gap!r} after {report.end_of_turn or '(no token)'}"
    table.add_row("stop gap", Text(gap))
    if report.variant is not None:
        v = report.variant
        table.add_row("rendered with", Text(f"{'a' if v.tools else 'no'} tools list, {v.arguments} arguments, "
                                            f"{v.sandbox} sandbox"))
    if string.ok:
        table.add_row("tool delta", Text(repr(string.after[len(string.before) :])))
    console.print(table)
    if not string.ok and string.first_mismatch is not None:
        at = string.first_mismatch
        console.print(Text("before: ", style="bold") + Text(repr(string.before[max(0, at - _CONTEXT) : at + _CONTEXT])),
                      soft_wrap=True)
        console.print(Text("after:  ", style="bold") + Text(repr(string.after[max(0, at - _CONTEXT) : at + _CONTEXT])),
                      soft_wrap=True)
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"), soft_wrap=True)
