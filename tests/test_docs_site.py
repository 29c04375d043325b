"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing page or anchor, a page not in
the nav, or a reference page that cannot be generated from the code fails the build, and so this test.

Skipped, saying so, where the ``docs`` extra (mkdocs, mkdocs-material, mkdocstrings) is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mkdocs", "material", "mkdocstrings")),
    reason="the docs extra is not installed (pip install -e '.[docs]', or scripts/setup.sh)")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=600)


def test_the_site_builds_strict_with_generated_reference_pages(tmp_path: Path) -> None:
    out = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stderr[-4000:]
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    from spanlab.jobs.config import TrainConfig

    for name in TrainConfig.model_fields:  # generated from the model: every key is on the page
        assert f"<code>{TrainConfig.model_fields[name].alias or name}</code>" in config, name
    assert "grpo.tasks_per_step" in config
    assert "SpanStore" in (tmp_path / "site" / "reference" / "python" / "index.html").read_text(encoding="utf-8")
    assert "/v1/traces" in (tmp_path / "site" / "reference" / "http" / "index.html").read_text(encoding="utf-8")


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The same config and pages, one of them given a link to a page that does not exist."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copytree(REPO / "scripts", copy / "scripts")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n[gone](no-such-page.md)\n", encoding="utf-8")
    out = build(copy / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0
    assert "no-such-page.md" in out.stderr
