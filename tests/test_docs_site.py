"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing page or anchor, a page not in
the nav, a reference page that cannot be generated from the code, or a committed one (the config keys, which the
README links) that differs from what the code generates fails the build, and so these tests.

The site's tests are skipped, saying so, where the ``docs`` extra (mkdocs, mkdocs-material, mkdocstrings) is not
installed; the committed page is checked without it.
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

needs_docs_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mkdocs", "material", "mkdocstrings")),
    reason="the docs extra is not installed (pip install -e '.[docs]', or scripts/setup.sh)")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=600)


def _docs_reference():  # scripts/ is not a package
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import docs_reference
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return docs_reference


def test_the_committed_config_reference_is_what_the_code_generates() -> None:
    """The README links docs/reference/config.md: it must exist without a docs build, and be current."""
    reference = _docs_reference()
    assert reference.stale_pages() == [], f"regenerate with: {reference.REGENERATE}"


@needs_docs_extra
def test_the_site_builds_strict_with_generated_reference_pages(tmp_path: Path) -> None:
    import html
    import re

    out = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stderr[-4000:]
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    from spanlab.jobs.config import TrainConfig

    for name in TrainConfig.model_fields:  # generated from the model: every key is on the page
        assert f"<code>{TrainConfig.model_fields[name].alias or name}</code>" in config, name
    assert "grpo.tasks_per_step" in config
    rows = re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>(.*?)</tr>", config, flags=re.S)
    assert len(rows) > 200, len(rows)  # every key of train, the algorithms, serve and run
    for key, rest in rows:  # type, default, and a description that says what the key is
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td>(.*?)</td>", rest, re.S)]
        assert len(cells) == 3 and cells[2], f"{key}: no description ({cells})"
        assert "\\" not in "".join(cells), f"{key}: a backslash shows: {cells}"
    types = {key: html.unescape(re.sub(r"<[^>]+>", "", rest.split("</td>")[0])).strip() for key, rest in rows}
    assert types["engine.served_model_name"] == "str | None" and types["engine.device"] == "'cpu' | 'gpu'"
    assert "SpanStore" in (tmp_path / "site" / "reference" / "python" / "index.html").read_text(encoding="utf-8")
    assert "/v1/traces" in (tmp_path / "site" / "reference" / "http" / "index.html").read_text(encoding="utf-8")


@needs_docs_extra
def test_a_broken_link_or_a_stale_config_page_fails_the_strict_build(tmp_path: Path) -> None:
    """The same config and pages, one of them given a link to a page that does not exist; then the committed
    config page edited by hand (it no longer matches the code)."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copytree(REPO / "scripts", copy / "scripts")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n[gone](no-such-page.md)\n", encoding="utf-8")
    out = build(copy / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0
    assert "no-such-page.md" in out.stderr
    page.write_text(page.read_text(encoding="utf-8").replace("[gone](no-such-page.md)", ""), encoding="utf-8")
    config = copy / "docs" / "reference" / "config.md"
    config.write_text(config.read_text(encoding="utf-8").replace("| `run_name` |", "| `run_nmae` |"),
                      encoding="utf-8")
    out = build(copy / "mkdocs.yml", tmp_path / "site2")
    assert out.returncode != 0 and "docs/reference/config.md is stale" in out.stderr + out.stdout
