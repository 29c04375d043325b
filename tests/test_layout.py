"""One meaning per name, checked on the source: who may import what, and where a name is imported from.

Read with ``ast`` (the module graph of tests/jobs/test_module_imports.py, type-only imports included), so a rule
broken inside a function or under ``if TYPE_CHECKING:`` is caught too. docs/glossary.md says what each name means.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

from tests.jobs.test_module_imports import import_graph

REPO = Path(__file__).resolve().parents[1]
CLI = {"spanlab.cli", "spanlab.serve"}  # the command line and the serve command itself


def _graph() -> dict[str, dict[str, int]]:
    graph = import_graph(REPO, "spanlab", with_types=True)
    assert len(graph) > 100 and "spanlab.agents.sql.mining" in graph, "the walk found spanlab's modules"
    return graph


def test_agents_never_import_the_store() -> None:
    """Agents turn tasks into calls and recorded data into demonstrations; reading the store is an adapter's job
    (spanlab/adapters/recorded_rollouts.py)."""
    bad = {m: sorted(t for t in targets if t.startswith("spanlab.store"))
           for m, targets in _graph().items() if m.startswith("spanlab.agents")}
    assert not {m: t for m, t in bad.items() if t}


def test_only_the_command_line_imports_the_serve_command() -> None:
    """Training names a served folder's files through spanlab/engine/served_folder.py, never through the CLI."""
    bad = [m for m, targets in _graph().items() if "spanlab.serve" in targets and m not in CLI]
    assert not bad


def _imports_of(name: str) -> dict[str, set[str]]:
    """File -> the modules it imports ``name`` from, over the package, tests, benchmarks and tutorials."""
    found: dict[str, set[str]] = {}
    for folder in ("spanlab", "tests", "benchmarks", "tutorials"):
        for path in (REPO / folder).rglob("*.py"):
            with warnings.catch_warnings():  # a script's odd escape in a string is not this test's business
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
                    found.setdefault(str(path.relative_to(REPO)), set()).add(node.module or "")
    return found


def test_sample_has_one_import_path() -> None:
    found = _imports_of("Sample")
    assert len(found) > 10, "the walk found the files that import Sample"
    assert {m for modules in found.values() for m in modules} == {"spanlab.adapters.samples"}, found
    exporting = [p for p in (REPO / "spanlab").rglob("*.py") if _exports(p, "Sample")]
    assert exporting == [REPO / "spanlab" / "adapters" / "samples.py"]


def _exports(path: Path, name: str) -> bool:
    """``name`` is in the module's ``__all__``, or a package's lazy export table names it."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id in ("__all__", "_EXPORTS") for t in targets) and \
                name in {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}:
            return True
    return False


def test_no_adapter_module_is_named_after_an_algorithm() -> None:
    """Adapters serve every algorithm (the sample reader feeds GRPO, SFT and the per-role policies)."""
    algorithms = {p.name for p in (REPO / "spanlab" / "algos").iterdir() if (p / "__init__.py").is_file()}
    assert {"grpo", "sft", "apo"} <= algorithms
    adapters = {p.stem for p in (REPO / "spanlab" / "adapters").glob("*.py")}
    assert not adapters & algorithms
