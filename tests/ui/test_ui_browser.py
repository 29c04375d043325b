"""The UI page in a real headless chromium (Debian's, via Selenium) against a store the tests wrote.

Skipped, with the reason, when selenium, chromium or chromedriver is missing (scripts/setup.sh installs them
when run as root with apt-get available).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spanlab.store.file_query import run_query
from spanlab.threaded_server import ThreadedServer
from spanlab.ui.browser import browser_unavailable, chromium, open_view
from tests.ui.conftest import HOSTILE_VERSION, ROLES_RUN, SINGLE_RUN, RolesStore, UiStore

pytestmark = pytest.mark.skipif(browser_unavailable() is not None, reason=str(browser_unavailable()))


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium() as d:
        yield d


def _css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def _wait(driver: Any, selector: str, timeout: float = 30) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, selector)))


def _wait_text(driver: Any, selector: str, text: str, timeout: float = 30) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, selector), text))


def test_page_loads_and_lists_the_stores_rollouts(driver: Any, ui_server: ThreadedServer, ui_store: UiStore) -> None:
    open_view(driver, ui_server.url + "/", "rollouts")
    assert driver.title == "spanlab"
    assert _css(driver, "#banner")[0].get_attribute("hidden") is not None  # no error shown
    total = sum(ui_store.by_status.values())
    shown = [td.text for td in _css(driver, "#rollouts-table tbody tr td:first-child")]
    newest = run_query(ui_store.path, "SELECT rollout_id FROM rollouts ORDER BY enqueue_time DESC, rollout_id "
                                      "LIMIT 50").column("rollout_id").to_pylist()
    assert shown == newest
    assert f"1–50 of {total}" in _css(driver, ".pager .range")[0].text
    _css(driver, ".pager button")[1].click()  # next page
    _wait_text(driver, ".pager .range", f"51–{total} of {total}")
    assert len(_css(driver, "#rollouts-table tbody tr")) == total - 50


def test_status_filter_in_the_form(driver: Any, ui_server: ThreadedServer, ui_store: UiStore) -> None:
    from selenium.webdriver.support.ui import Select

    open_view(driver, ui_server.url + "/#/rollouts", "rollouts")
    Select(_css(driver, "select[name=status]")[0]).select_by_value("failed")
    _css(driver, "#rollout-filters button[type=submit]")[0].click()
    n = ui_store.by_status["failed"]
    _wait_text(driver, ".pager .range", f"1–{n} of {n}")
    assert "status=failed" in driver.current_url
    statuses = [td.text for td in _css(driver, "#rollouts-table tbody tr td:nth-child(2)")]
    assert statuses == ["failed"] * ui_store.by_status["failed"]


def test_rollout_view_then_token_view_of_a_call(driver: Any, ui_server: ThreadedServer, ui_store: UiStore) -> None:
    open_view(driver, f"{ui_server.url}/#/rollout/{ui_store.first_rollout}", "rollout")
    kinds = [td.text for td in _css(driver, "#spans-table tbody tr td:nth-child(2)")]
    assert kinds == ["llm_call", "tool_call", "llm_call", "reward"]
    _css(driver, "a.token-link")[0].click()
    _wait(driver, "body[data-ready=call]")
    span_id = driver.current_url.rsplit("/", 1)[1]
    prompt_len, response_len = ui_store.calls[span_id]
    toks = _css(driver, "#tokens .tok")
    assert len(toks) == prompt_len + response_len
    assert len(_css(driver, "#tokens .tok.sampled")) == response_len
    assert len(_css(driver, "#tokens .tok.prompt")) == prompt_len
    colour = {t.get_attribute("class"): t.value_of_css_property("background-color") for t in (toks[0], toks[-1])}
    assert colour["tok prompt"] != colour["tok sampled"]


def test_token_hover_shows_the_id_and_drift_marks(driver: Any, ui_server: ThreadedServer, ui_store: UiStore) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    open_view(driver, f"{ui_server.url}/#/call/{ui_store.drift_span}", "call")
    prompt_len, _ = ui_store.calls[ui_store.drift_span]
    drift = _css(driver, "#tokens .tok.drift")
    assert [t.text for t in drift] == ["f", "o", "u", "r"]
    assert all("sampled" in t.get_attribute("class") for t in drift)
    ids = run_query(ui_store.path, f"SELECT response_token_ids FROM llm_calls WHERE span_id = '{ui_store.drift_span}'"
                    ).to_pylist()[0]["response_token_ids"]
    ActionChains(driver).move_to_element(drift[1]).perform()
    tip = _css(driver, "#tip")[0]
    assert tip.is_displayed()
    assert f"id {ids[1]}" in tip.text and "re-tokenizing gives" in tip.text
    assert [int(t.get_attribute("data-id")) for t in _css(driver, "#tokens .tok")[prompt_len:]] == ids


def test_tito_session_view_marks_segments(driver: Any, ui_server: ThreadedServer, ui_store: UiStore) -> None:
    open_view(driver, f"{ui_server.url}/#/session/{ui_store.tito_attempt}", "session")
    assert len(_css(driver, "#tokens .tok")) == 28
    assert len(_css(driver, "#tokens .tok.sampled")) == 11
    assert [s.text for s in _css(driver, "#tokens .seg")] == ["segment 0", "segment 1"]
    # the boundary sits right before token 20
    following = driver.execute_script(
        "return [...document.querySelectorAll('#tokens .seg')][1].nextElementSibling.dataset.i")
    assert following == "20"


def test_curves_of_a_training_run(driver: Any, ui_server: ThreadedServer) -> None:
    open_view(driver, f"{ui_server.url}/#/runs?run=run-a", "runs")
    charts = {c.get_attribute("data-metric"): c for c in _css(driver, "#charts .chart")}
    assert sorted(charts) == ["loss", "reward_mean"]
    for chart in charts.values():
        path = chart.find_element("css selector", "path.line").get_attribute("d")
        assert path.startswith("M") and path.count("L") == 11  # 12 steps


def test_sql_box_returns_rows_and_refuses_writes(driver: Any, ui_server: ThreadedServer, ui_store: UiStore) -> None:
    open_view(driver, f"{ui_server.url}/#/sql", "sql")
    box = _css(driver, "#sql-query")[0]
    box.clear()
    box.send_keys("SELECT rollout_id, mode FROM rollouts WHERE mode = 'val' ORDER BY rollout_id")
    _css(driver, "#sql-run")[0].click()
    _wait(driver, "#sql-result table")
    assert len(_css(driver, "#sql-result tbody tr")) == ui_store.by_mode["val"]
    assert "row(s)" in _css(driver, "#sql-status")[0].text
    box.clear()
    box.send_keys("DELETE FROM rollouts")
    _css(driver, "#sql-run")[0].click()
    assert "not allowed" in _wait(driver, "#sql-error").text


def test_per_role_table_of_a_run_shows_rewards_and_versions_as_text(driver: Any, roles_server: ThreadedServer) -> None:
    """The multi-agent run's role_summary rows in the table; a version tag that is markup shows as its text."""
    from urllib.parse import quote

    open_view(driver, f"{roles_server.url}/#/runs?run={quote(ROLES_RUN, safe='')}", "runs")
    assert _css(driver, "#banner")[0].get_attribute("hidden") is not None
    head = [th.text for th in _css(driver, "#roles-table thead th")]
    rows = [[td.text for td in tr.find_elements("css selector", "td")] for tr in _css(driver, "#roles-table tbody tr")]
    cell = {name: i for i, name in enumerate(head)}
    assert [(r[cell["step"]], r[cell["role"]], r[cell["policy"]], r[cell["versions seen"]]) for r in rows] == [
        ("0", "checker", "lora-b", "lora-b-v1"), ("0", "writer", "lora-a", "lora-a-v1"),
        ("1", "checker", "lora-b", HOSTILE_VERSION), ("1", "writer", "lora-a", "lora-a-v2")]
    assert [r[cell["final reward (mean)"]] for r in rows] == ["0.500", "0.500", "1", "1"]
    assert [r[cell["intermediate reward (mean)"]] for r in rows] == ["", "0.250", "", "1"]
    assert _css(driver, "#roles-table img") == []
    assert driver.execute_script("return document.body.dataset.pwned") is None


def test_a_single_agent_run_renders_without_the_role_table(driver: Any, roles_server: ThreadedServer) -> None:
    open_view(driver, f"{roles_server.url}/#/runs?run={SINGLE_RUN}", "runs")
    assert _css(driver, "#banner")[0].get_attribute("hidden") is not None  # no error shown
    assert _css(driver, "#roles-table") == [] and "names an agent role" in _css(driver, "#no-roles")[0].text
    assert len(_css(driver, "#charts .chart")) == 1  # the rest of the run's page is there


def test_span_list_shows_each_calls_role_and_policy_version(driver: Any, roles_server: ThreadedServer,
                                                            roles_store: RolesStore) -> None:
    open_view(driver, f"{roles_server.url}/#/rollout/{roles_store.rollouts[ROLES_RUN][2]}", "rollout")
    head = [th.text for th in _css(driver, "#spans-table thead th")]
    role, version = head.index("role") + 1, head.index("policy version") + 1
    roles = [td.text for td in _css(driver, f"#spans-table tbody tr td:nth-child({role})")]
    versions = [td.text for td in _css(driver, f"#spans-table tbody tr td:nth-child({version})")]
    assert roles == ["writer", "", "writer", "checker", ""]
    assert versions == ["lora-a-v2", "", "lora-a-v2", HOSTILE_VERSION, ""]
    assert _css(driver, "#spans-table img") == []
