"""Load a repository script (a tutorial's or a benchmark's ``.py``, not a package module) as a module for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` executed as module ``name`` (its ``main()`` does not run: scripts guard it),
    registered in ``sys.modules`` as an import would be (a dataclass resolves its annotations there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
