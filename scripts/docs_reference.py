"""The docs site's generated reference pages: config keys, the CLI and the HTTP routes, read from the code.

The CLI and HTTP pages are generated at build time (``scripts/mkdocs_hooks.py`` adds them to the site). The config
page is committed (``docs/reference/config.md``: the README links it, and GitHub shows it without a build), and
the build fails when it differs from what the code generates, so neither can drift from the pydantic models, the
typer app and the FastAPI/Starlette apps they describe.

Run: ``python scripts/docs_reference.py config|cli|http`` prints one page; ``--write`` rewrites the committed
ones (after changing a config model); ``--check`` exits 1 naming any that is stale.
"""

from __future__ import annotations

import enum
import sys
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


# Inside code, a cell's pipes must neither split the cell on GitHub (which reads the committed config page) nor
# show a backslash on the site (Python-Markdown keeps ``\|`` in a code span): HTML code with character
# references reads the same in both, and no markdown inside it (``*``, ``_``, ``[``) is taken as markup.
_CODE_CHARS = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;", "*": "&#42;", "_": "&#95;", "[": "&#91;",
               "]": "&#93;", "`": "&#96;", "\\": "&#92;"}


def _code(text: str) -> str:
    """``text`` as inline code inside a markdown table cell."""
    return "<code>" + "".join(_CODE_CHARS.get(c, c) for c in text.replace("\n", " ")) + "</code>"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else _type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        return "(section)" if isinstance(value, BaseModel) else repr(value)
    if field.default is PydanticUndefined:
        return REQUIRED
    value = field.default
    if isinstance(value, Path):
        return repr(str(value))
    return repr(value.value if isinstance(value, enum.Enum) else value)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (a section, an optional section, a union of sections)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


REQUIRED = "(required)"


def _rows(model: type[BaseModel], prefix: str, seen: tuple[type, ...] = ()) -> Iterator[str]:
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        default = _default(field)
        yield (f"| `{key}` | {_code(_type_name(field.annotation))} | "
               f"{'**required**' if default == REQUIRED else _code(default)} | {_cell(field.description or '')} |")
        for sub in _models_in(field.annotation):
            if sub not in seen:
                yield from _rows(sub, f"{key}.", (*seen, model))


TABLE_HEAD = "| key | type | default | what it is |\n|---|---|---|---|"


def config_page() -> str:
    """Every key of a ``spanlab train`` config, the algorithms' sections included, and of ``serve.yaml`` and
    ``run.yaml``."""
    from spanlab.config import RunConfig
    from spanlab.jobs.config import TrainConfig
    from spanlab.jobs.registry import BUILTIN, load_algorithm
    from spanlab.serve import ServeConfig

    out = ["# Config keys", "",
           "Generated from the pydantic models (`python scripts/docs_reference.py --write`; the docs build and the",
           "tests fail when this page differs from the code). Unknown keys are errors naming the key;",
           "`spanlab train --check CONFIG.yaml` prints every setting as a run would use it.", "",
           "## `spanlab train` (`spanlab.jobs.config.TrainConfig`)", "",
           "The algorithm's own settings live in the section named after it (`grpo:`, `sft:`, `apo:`); the",
           "generic `section` field below stands for that key.", "", TABLE_HEAD,
           *_rows(TrainConfig, "")]
    for name in sorted(BUILTIN):
        model = load_algorithm(name).config_model
        out += ["", f"### `{name}:` (`{model.__module__}.{model.__name__}`)", "", TABLE_HEAD, *_rows(model, f"{name}.")]
    out += ["", "## `spanlab serve` (`serve.yaml`, `spanlab.serve.ServeConfig`)", "", TABLE_HEAD,
            *_rows(ServeConfig, ""),
            "", "## `spanlab run` (`run.yaml`, `spanlab.config.RunConfig`)", "", TABLE_HEAD, *_rows(RunConfig, "")]
    return "\n".join(out) + "\n"


def cli_page() -> str:
    """Every ``spanlab`` command with its help text, arguments and options, from the typer app."""
    import typer

    from spanlab.cli import app

    out = ["# CLI: `spanlab`", "", "Generated from the typer app (`spanlab/cli.py`) at build time; "
           "`spanlab COMMAND --help` prints the same.", ""]

    def walk(cmd: Any, path: list[str]) -> None:
        if len(path) > 1:
            out.extend([f"## `{' '.join(path)}`", "", (cmd.help or "").strip(), ""])
            params = [p for p in cmd.params if p.name != "help"]
            if params:
                out.extend(["| argument / option | what it is |", "|---|---|"])
                for p in params:
                    names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
                    helptext = getattr(p, "help", None) or ""
                    if not p.required and p.default not in (None, (), False) and not callable(p.default):
                        helptext += f" (default: `{p.default}`)"
                    out.append(f"| {names} | {_cell(helptext)} |")
                out.append("")
        commands = getattr(cmd, "commands", None) or {}  # typer's groups are click groups of its own click
        for name in sorted(commands):
            walk(commands[name], [*path, name])

    walk(typer.main.get_command(app), ["spanlab"])
    return "\n".join(out) + "\n"


def _openapi_routes(app: Any) -> list[str]:
    rows = []
    for path, methods in sorted(app.openapi().get("paths", {}).items()):
        for method, op in methods.items():
            rows.append(f"| `{method.upper()}` | `{path}` | {_cell(op.get('summary', ''))} |")
    return rows


def _starlette_routes(app: Any) -> list[str]:
    rows = []
    for route in app.routes:
        path = getattr(route, "path", None)
        if path is None:
            continue
        endpoint = getattr(route, "endpoint", None)
        endpoint = getattr(endpoint, "func", endpoint)  # a functools.partial's own doc says nothing
        doc = (getattr(endpoint, "__doc__", None) or "").strip().split("\n")[0]
        methods = ", ".join(sorted(getattr(route, "methods", None) or ["(any)"]))
        rows.append(f"| `{methods}` | `{path}` | {_cell(doc)} |")
    return rows


def http_page() -> str:
    """The routes of the store server and the web UI (from their OpenAPI) and of the gateway (its route table)."""
    from spanlab.gateway.app import create_app as gateway_app
    from spanlab.store import SpanStore
    from spanlab.store.server import create_store_app
    from spanlab.ui.app import create_app as ui_app

    head = "| method | path | what it does |\n|---|---|---|"
    out = ["# HTTP APIs", "", "Generated at build time from the apps themselves: the store server's and the UI's",
           "OpenAPI descriptions (served live at `/openapi.json` and `/api/openapi.json`), and the gateway's route",
           "table. Guards that apply to every route: [Security](../security.md).", ""]
    with tempfile.TemporaryDirectory() as tmp, SpanStore(Path(tmp) / "ref.duckdb") as store:
        out += ["## Store server (`spanlab store serve`)", "", head, *_openapi_routes(create_store_app(store)), ""]
        out += ["## Recording gateway (`spanlab serve`)", "",
                "Every OpenAI route is also served under the attribution prefixes "
                "`/rollout/{rid}/attempt/{aid}/` and `/rollout/{rid}/attempt/{aid}/agent/{role}/` "
                "([the gateway](../gateway.md)).", "", head,
                *_starlette_routes(gateway_app(store, "http://127.0.0.1:9/v1")), ""]
        out += ["## Web UI (`spanlab ui`)", "", head, *_openapi_routes(ui_app(Path(tmp) / "ref.duckdb")), ""]
    return "\n".join(out) + "\n"


PAGES = {"reference/config.md": config_page, "reference/cli.md": cli_page, "reference/http.md": http_page}
COMMITTED = ("reference/config.md",)  # kept in docs/ (the README links it); the others exist only in the built site
DOCS = Path(__file__).resolve().parents[1] / "docs"
REGENERATE = "python scripts/docs_reference.py --write"


def stale_pages(docs: Path = DOCS) -> list[str]:
    """The committed pages whose file differs from what the code generates now (or is missing)."""
    return [uri for uri in COMMITTED
            if not (docs / uri).is_file() or (docs / uri).read_text(encoding="utf-8") != PAGES[uri]()]


def write_pages(docs: Path = DOCS) -> None:
    for uri in COMMITTED:
        (docs / uri).write_text(PAGES[uri](), encoding="utf-8", newline="\n")


if __name__ == "__main__":
    if sys.argv[1] == "--write":
        write_pages()
    elif sys.argv[1] == "--check":
        if stale := stale_pages():
            sys.exit(f"stale: {', '.join('docs/' + uri for uri in stale)}; regenerate with: {REGENERATE}")
    else:
        sys.stdout.write(PAGES[f"reference/{sys.argv[1]}.md"]())
