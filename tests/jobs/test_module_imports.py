"""spanlab's modules import each other without runtime cycles, and the pure parts never import the store.

Beside the package-level check of tests/jobs/test_imports.py, this one works per module (file): the graph of
every ``import``/``from ... import`` in spanlab/ (at module level or inside functions), read with ``ast``, with
relative imports resolved by ``importlib.util.resolve_name``. Imports under ``if TYPE_CHECKING:`` are skipped:
they never run, so a loop through one is a loop of types, not of imports. A parent package's ``__init__``,
which Python runs before any of its modules, is not an edge: it only counts where a module names it.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PURE = ("spanlab.tito", "spanlab.training")  # token logic and torch parts: they take data, never read the store


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file for every module of ``package`` (a folder under ``root``)."""
    found = {}
    for path in (root / package.replace(".", "/")).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts).removesuffix(".__init__")] = path
    return found


def _imports(path: Path, module: str, modules: dict[str, Path], *, with_types: bool) -> dict[str, int]:
    """The modules of ``modules`` that ``module`` imports -> the line of the first such import; ``with_types``:
    also those under ``if TYPE_CHECKING:``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: dict[str, int] = {}

    def target(name: str, line: int) -> None:
        while name not in modules and "." in name:  # a name defined in a module, not a module
            name = name.rpartition(".")[0]
        if name in modules and name != module:
            out.setdefault(name, line)

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test) and not with_types:
                for stmt in child.orelse:
                    walk(ast.Module(body=[stmt], type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target(alias.name, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = importlib.util.resolve_name("." * child.level + (child.module or ""), package) \
                    if child.level else child.module or ""
                for alias in child.names:  # ``from pkg import sub`` imports the module pkg.sub when there is one
                    target(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base, child.lineno)
            walk(child)

    walk(ast.parse(path.read_text(encoding="utf-8")))
    return out


def import_graph(root: Path, package: str, *, with_types: bool = False) -> dict[str, dict[str, int]]:
    modules = _modules(root, package)
    return {m: _imports(p, m, modules, with_types=with_types) for m, p in sorted(modules.items())}


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle (first module repeated at the end), or None; depth-first, iteratively."""
    state: dict[str, str] = {}
    for start in graph:
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = "open"
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                stack.pop()
            elif state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, {}))))
    return None


def _describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)) + f" -> {cycle[-1]}"


def test_no_runtime_import_cycle_between_spanlab_modules() -> None:
    graph = import_graph(REPO, "spanlab")
    assert len(graph) > 100 and graph["spanlab.gateway.proxy"], "the walk found spanlab's modules and their imports"
    cycle = find_cycle(graph)
    assert cycle is None, "runtime import cycle: " + _describe(graph, cycle or [])


@pytest.mark.parametrize("package", PURE)
def test_the_pure_packages_never_import_the_store(package: str) -> None:
    """Type-only imports count too: these packages take spans, tables, samples and tensors given to them."""
    graph = import_graph(REPO, "spanlab", with_types=True)
    inside = [m for m in graph if m == package or m.startswith(package + ".")]
    assert inside
    bad = {m: [t for t in graph[m] if t == "spanlab.store" or t.startswith("spanlab.store.")] for m in inside}
    assert not {m: t for m, t in bad.items() if t}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def test_the_walk_finds_a_loop_through_a_function_import_and_skips_one_of_types(tmp_path: Path) -> None:
    """The checker itself, on a package written here: a loop closed by an import inside a function is a cycle;
    the same loop closed under ``if TYPE_CHECKING:`` is not, and a relative import resolves to its module."""
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from pkg import b\nA = 1\n",
        "pkg/b.py": "def f():\n    from .c import C\n    return C\n",
        "pkg/c.py": "from pkg.a import A\nC = A\n",
    })
    cycle = find_cycle(import_graph(tmp_path, "pkg"))
    assert cycle is not None and set(cycle) == {"pkg.a", "pkg.b", "pkg.c"}
    _write(tmp_path, {"pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"})
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
    assert import_graph(tmp_path, "pkg", with_types=True)["pkg.c"] == {"pkg.a": 3}
