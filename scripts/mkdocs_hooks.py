"""mkdocs hooks: add the generated reference pages (``scripts/docs_reference.py``) to the site at build time, and
fail the build when a committed one (``docs/reference/config.md``) differs from what the code generates."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_reference import COMMITTED, PAGES, REGENERATE, stale_pages  # a sibling script, not a package

log = logging.getLogger("mkdocs.hooks.spanlab")


def on_files(files: Files, config: Any) -> Files:
    """The committed reference page must be what the code generates now; the others are generated here, and a page
    of their name on disk would be stale, so it is an error."""
    if stale := stale_pages(Path(config["docs_dir"])):
        raise SystemExit(f"docs/{stale[0]} is stale (it must be what the code generates): {REGENERATE}")
    for uri, make in PAGES.items():
        if uri in COMMITTED:
            continue
        if files.get_file_from_path(uri) is not None:
            raise SystemExit(f"docs/{uri} is generated (scripts/docs_reference.py): delete the file on disk")
        log.info("generating %s", uri)
        files.append(File.generated(config, uri, content=make()))
    return files
