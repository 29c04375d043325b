"""Screenshots of the docs site (docs/img/site-*.png): the home page, a guide and a reference page.

Builds the site into a temporary folder, serves it on 127.0.0.1 with the standard library's HTTP server, opens
each page in headless chromium (:mod:`spanlab.ui.browser`, the UI's own browser driver) and stops the server.

Run: PYTHONPATH=. .venv/bin/python scripts/docs_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import functools
import logging
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from spanlab.ui.browser import chromium

REPO = Path(__file__).resolve().parents[1]
PAGES = (("site-home.png", "", 1000), ("site-guide.png", "tutorials/calc/", 1000),
         ("site-reference.png", "reference/config/", 1400))  # down to the engine keys' `str | None` types
logger = logging.getLogger("docs_screenshots")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=REPO,
                       check=True)
        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(site))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/"
            with chromium(1280, 1000) as driver:
                for name, path, height in PAGES:
                    driver.set_window_size(1280, height)
                    driver.get(url + path)
                    driver.find_element("css selector", "article h1")  # the page rendered its content
                    driver.save_screenshot(str(args.out / name))
                    logger.info("wrote %s (%s)", args.out / name, url + path)
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


if __name__ == "__main__":
    main()
