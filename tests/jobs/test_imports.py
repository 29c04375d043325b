"""Choosing an algorithm loads only what it runs, and spanlab's packages import each other without cycles."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "spanlab"

PROBE = """
import json, sys
from spanlab.jobs.config import load_train_config
from spanlab.jobs.job import check_job
check_job(load_train_config(sys.argv[1]))
if sys.argv[2] == "run-imports":  # what the APO run itself imports
    import spanlab.algos.apo.optimizer, spanlab.algos.apo.rollouts, spanlab.algos.apo.search, spanlab.jobs.rig
print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("spanlab.algos."))))
"""


def _modules_after(config: str, mode: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(REPO / config), mode], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("mode", ["check", "run-imports"])
def test_apo_never_imports_torch_nor_another_algorithm(mode: str) -> None:
    loaded = _modules_after("tutorials/rooms/apo.yaml", mode)
    assert "torch" not in loaded
    assert all(m.startswith("spanlab.algos.apo") for m in loaded), loaded


def test_checking_a_grpo_config_loads_neither_torch_nor_the_other_algorithms() -> None:
    loaded = _modules_after("tutorials/calc/grpo.yaml", "check")
    assert "torch" not in loaded
    assert all(m.startswith("spanlab.algos.grpo") for m in loaded) and "spanlab.algos.grpo.update" not in loaded


def _package_of(module: str) -> str:
    """``spanlab.x`` for a module of package ``spanlab/x/`` (or the top-level module ``spanlab/x.py``)."""
    return ".".join(module.split(".")[:2])


def _import_graph() -> dict[str, set[str]]:
    """Package -> packages it imports (at module level or inside functions; TYPE_CHECKING-only ones too)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                if name.startswith("spanlab.") and _package_of(name) != _package_of(module):
                    graph[_package_of(module)].add(_package_of(name))
    return graph


def test_no_import_cycle_between_spanlab_packages() -> None:
    graph = _import_graph()
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycle = [*path[path.index(nxt):], nxt] if nxt in path else [node, nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for package in sorted(graph):
        if package not in state:
            visit(package, [package])
