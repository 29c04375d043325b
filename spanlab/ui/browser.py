"""Headless Debian chromium driven by Selenium: the UI's browser tests and its README screenshots.

Why system chromium + chromedriver and not a downloaded browser: the machines this runs on have no browser
download service; ``apt-get install chromium chromium-driver`` (scripts/setup.sh does it when root) gives a
matched pair. ``selenium`` is a dev dependency; :func:`browser_unavailable` says why a browser cannot start
so tests can skip with that reason.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars",
)
CHROMIUM_NAMES = ("chromium", "chromium-browser")


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def browser_unavailable() -> str | None:
    """None when a browser can be started, else the reason (what to install)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _chromium() is None:
        return "chromium is not installed (apt-get install chromium chromium-driver)"
    if shutil.which("chromedriver") is None:
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A Selenium WebDriver on headless chromium with a fresh profile, closed (and its profile removed) on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    reason = browser_unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix="spanlab-chromium-") as profile:
        opts = webdriver.ChromeOptions()
        opts.binary_location = _chromium() or ""
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            opts.add_argument(flag)
        driver = webdriver.Chrome(options=opts, service=Service(executable_path=shutil.which("chromedriver")))
        try:
            driver.set_page_load_timeout(60)
            yield driver
        finally:
            driver.quit()


def open_view(driver: Any, url: str, view: str, timeout: float = 30.0) -> None:
    """Load ``url`` (a hash route) and wait until the page says it finished rendering ``view``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, timeout).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, f'body[data-ready="{view}"]'))
    )
