"""mkdocs hooks: add the generated reference pages (``scripts/docs_reference.py``) to the site at build time."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_reference import PAGES  # a sibling script, not a package

log = logging.getLogger("mkdocs.hooks.spanlab")


def on_files(files: Files, config: Any) -> Files:
    """Each reference page is generated from the code; a page of that name on disk would be stale, so it is an
    error."""
    for uri, make in PAGES.items():
        if files.get_file_from_path(uri) is not None:
            raise SystemExit(f"docs/{uri} is generated (scripts/docs_reference.py): delete the file on disk")
        log.info("generating %s", uri)
        files.append(File.generated(config, uri, content=make()))
    return files
