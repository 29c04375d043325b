"""Screenshots of the UI's main views (the README's docs/img/ui-*.png), taken with headless chromium.

Picks a rollout with calls (a TITO one when the store has sessions), opens the rollouts table, its token view,
the curves of the latest training run and the SQL box, and writes one PNG per view; when a run's calls name agent
roles or policies, also that run's per-role table (ui-roles.png). Needs the dev extra
(selenium) and Debian's chromium + chromedriver.

Run: .venv/bin/python -m spanlab.ui.screenshots --db runs/calc.duckdb --out docs/img [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from urllib.parse import quote

from spanlab.threaded_server import ThreadedServer
from spanlab.ui.app import create_app
from spanlab.ui.browser import chromium, open_view
from spanlab.ui.db import ReadOnlyStore, objects
from spanlab.ui.tokens import default_loader

logger = logging.getLogger(__name__)
SQL = ("SELECT mode, count(*) AS rollouts, round(avg(final_reward), 3) AS reward, avg(llm_calls) AS calls,\n"
       "       sum(response_tokens) AS sampled_tokens\nFROM rollout_summary GROUP BY mode ORDER BY mode")


def _targets(db: Path) -> tuple[str, str]:
    """(token view route, rollout ID): a TITO session with sampled turns and tool deltas if any, else a call."""
    store = ReadOnlyStore(db)
    with store.connection() as conn:
        if "tito_sessions" in objects(conn):
            rows = store.fetch("SELECT attempt_id, rollout_id FROM tito_sessions WHERE calls >= 2 AND segment = 0 "
                               "ORDER BY num_tokens LIMIT 1")
            if rows:
                return f"session/{quote(rows[0]['attempt_id'])}", rows[0]["rollout_id"]
    rows = store.fetch("SELECT span_id, rollout_id FROM llm_calls ORDER BY response_len DESC LIMIT 1")
    return f"call/{quote(rows[0]['span_id'])}", rows[0]["rollout_id"]


def _roles_run(db: Path) -> str | None:
    """A training run whose calls name a role or a policy (the per-role table has rows), if any."""
    store = ReadOnlyStore(db)
    with store.connection() as conn:
        if "role_summary" not in objects(conn) or "train_metrics" not in objects(conn):
            return None
    rows = store.fetch("SELECT run_id FROM role_summary WHERE (role IS NOT NULL OR policy IS NOT NULL) AND run_id IN "
                       "(SELECT run_id FROM train_metrics) GROUP BY run_id ORDER BY count(*) DESC LIMIT 1")
    return rows[0]["run_id"] if rows else None


def take(db: Path, out: Path, tokenizer: Path | None = None, width: int = 1280) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    token_route, rollout_id = _targets(db)
    shots = [("ui-rollouts.png", "#/rollouts?limit=25", "rollouts", 760),
             ("ui-rollout.png", f"#/rollout/{quote(rollout_id)}", "rollout", 640),
             ("ui-tokens.png", f"#/{token_route}", token_route.split("/")[0], 1130),
             ("ui-curves.png", "#/runs", "runs", 780),
             ("ui-sql.png", "#/sql?q=" + quote(SQL), "sql", 540)]
    if (roles_run := _roles_run(db)) is not None:
        shots.append(("ui-roles.png", f"#/runs?run={quote(roles_run, safe='')}", "runs", 640))
    written = []
    app = create_app(db, default_loader(tokenizer))
    with ThreadedServer(app, name="ui") as srv, chromium(width, 800) as driver:
        for name, route, view, height in shots:
            driver.set_window_size(width, height)
            open_view(driver, f"{srv.url}/{route}", view)
            if view == "sql":
                driver.find_element("css selector", "#sql-run").click()
                driver.implicitly_wait(10)  # the query runs after the click: wait for its result table
                driver.find_element("css selector", "#sql-result table")
            if name == "ui-roles.png":  # the table sits below the curves
                driver.execute_script("document.getElementById('roles-table').scrollIntoView()")
            if view in ("session", "call"):  # show the hover box on a sampled token
                from selenium.webdriver.common.action_chains import ActionChains

                sampled = driver.find_elements("css selector", "#tokens .tok.sampled")
                if len(sampled) > 6:
                    ActionChains(driver).move_to_element(sampled[6]).perform()
            path = out / name
            driver.save_screenshot(str(path))
            logger.info("wrote %s (%d KB)", path, path.stat().st_size // 1024)
            written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--tokenizer", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    take(args.db, args.out, args.tokenizer)


if __name__ == "__main__":
    main()
