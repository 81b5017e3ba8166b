"""The dashboard over real HTTP on a real database: pages, sign-in, the retry action and
every refusal (exact status, nothing changed), and that the public listener never serves it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import Engine, text

from connector.core.metrics import Metrics
from connector.intake.receivers import create_app
from connector.shell.admin import create_admin_app
from connector.shell.dashboard import security
from connector.shell.service import serve_in_thread
from crm_sandboxes import SalesforceSandbox
from tests.helpers.dashboard_world import ORG, World, build_world, dead_row, outbox_states

TOKEN = "admin-token-for-the-dashboard-0123"


@pytest.fixture
def world(engine: Engine, sf: SalesforceSandbox) -> World:
    return build_world(engine, sf)


@contextmanager
def dashboard(engine: Engine, world: World, token: str | None = None) -> Iterator[httpx.Client]:
    app = create_admin_app(engine, Metrics(), token=token, configs={ORG: world.cfg})
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield client


def pages(world: World) -> list[str]:
    lead = world.lead_ids[world.pushed_crm_id]
    return [
        "/dashboard/",
        f"/dashboard/org/{ORG}",
        f"/dashboard/org/{ORG}/totals",
        f"/dashboard/org/{ORG}/lead/{lead}",
    ]


def csrf_of(page: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert m, "no CSRF value in the page"
    return m.group(1)


def test_every_page_is_self_contained_html(engine: Engine, world: World) -> None:
    with dashboard(engine, world) as c:
        for path in pages(world):
            resp = c.get(path)
            assert resp.status_code == 200, path
            assert resp.headers["content-type"] == "text/html; charset=utf-8"
            csp = resp.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "form-action 'self'" in csp
            body = resp.text
            # No external URL anywhere: every link, form and resource is a local path.
            assert "http:" not in body and "https:" not in body and "//" not in body, path
            for ref in re.findall(r'(?:href|src|action)="([^"]*)"', body):
                assert ref.startswith("/dashboard/"), (path, ref)
            assert "<script" not in body and "<link" not in body and "<img" not in body
        assert c.get("/dashboard").status_code == 308


def test_pages_show_the_recorded_story(engine: Engine, world: World) -> None:
    pushed = world.lead_ids[world.pushed_crm_id]
    with dashboard(engine, world) as c:
        org = c.get(f"/dashboard/org/{ORG}").text
        lead = c.get(f"/dashboard/org/{ORG}/lead/{pushed}").text
        dead = c.get(f"/dashboard/org/{ORG}/lead/{world.lead_ids[world.dead_crm_id]}").text
    assert 'data-figure="outbox.dead">1<' in org and 'data-figure="outbox.superseded">1<' in org
    assert "NOT_FOUND" in org and world.reps[3] in org  # the CRM's reason, the owner found
    assert f'href="/dashboard/org/{ORG}/lead/{pushed}"' in org  # decisions link their lead
    assert "salesforce_outbound" in lead and "04l000000000000001" in lead  # the push
    assert 'data-figure="rule">rule 1: default' in lead
    # the rules tried, with the condition that failed and the lead's value (explain's lines)
    tried = re.findall(r"<li><code>([^<]*)</code></li>", lead.split('data-list="rules"')[1])
    q, arrow = "&#34;", "-&gt;"
    assert tried[1] == f"rule 1 {q}rule 1: default{q} {arrow} team americas: matched (default rule)"
    assert tried[0].startswith(
        f"rule 0 {q}rule 0: Country{q} {arrow} team emea: no match "
        "(Country: wanted de|fr, lead has "
    )
    assert 'data-figure="team">americas' in lead
    assert 'data-figure="state">sent<' in lead
    assert 'data-figure="state">dead<' in dead and "NOT_FOUND" in dead


def test_unknown_org_and_lead_are_404(engine: Engine, world: World, sf: SalesforceSandbox) -> None:
    with dashboard(engine, world) as c:
        for path in (
            "/dashboard/org/nope",
            "/dashboard/org/nope/totals",
            f"/dashboard/org/nope/lead/{world.lead_ids[world.pushed_crm_id]}",
            f"/dashboard/org/{ORG}/lead/999999",
        ):
            assert c.get(path).status_code == 404, path
        assert c.get(f"/dashboard/org/{ORG}/lead/abc").status_code == 404


def test_retry_through_the_page_requeues_the_dead_row(engine: Engine, world: World) -> None:
    row = dead_row(engine)
    with dashboard(engine, world) as c:
        page = c.get(f"/dashboard/org/{ORG}").text
        before = outbox_states(engine)
        resp = c.post(f"/dashboard/org/{ORG}/outbox/{row}/retry", data={"csrf": csrf_of(page)})
        assert resp.status_code == 303
        assert resp.headers["location"] == f"/dashboard/org/{ORG}?retried={row}#dead"
        after = outbox_states(engine)
        assert after[row] == ("pending", 0)
        assert {k: v for k, v in after.items() if k != row} == {
            k: v for k, v in before.items() if k != row
        }
        shown = c.get(resp.headers["location"]).text
        assert f"Outbox row {row} is pending again" in shown
        assert 'data-figure="outbox.pending">1<' in shown
        # Again: the row is no longer dead, so nothing happens.
        again = c.post(f"/dashboard/org/{ORG}/outbox/{row}/retry", data={"csrf": csrf_of(page)})
        assert again.status_code == 409
        assert outbox_states(engine) == after


def test_retry_refusals_change_nothing(engine: Engine, world: World) -> None:
    row = dead_row(engine)
    sent = next(k for k, (s, _) in outbox_states(engine).items() if s == "sent")
    with dashboard(engine, world) as c:
        good = csrf_of(c.get(f"/dashboard/org/{ORG}").text)
        cookie = c.cookies.get(security.COOKIE)
        before = outbox_states(engine)
        url = f"/dashboard/org/{ORG}/outbox/{row}/retry"
        cases: list[tuple[str, int, dict[str, object]]] = [
            ("no csrf field", 403, {"data": {}}),
            ("empty csrf", 403, {"data": {"csrf": ""}}),
            ("wrong csrf", 403, {"data": {"csrf": "0" * 64}}),
            ("csrf in the query, not the form", 403, {"params": {"csrf": good}, "data": {}}),
            ("json body", 400, {"json": {"csrf": good}}),
            ("oversized form", 400, {"data": {"csrf": good, "pad": "x" * 5000}}),
            (
                "other org",
                404,
                {"url": f"/dashboard/org/nope/outbox/{row}/retry", "data": {"csrf": good}},
            ),
            (
                "a sent row",
                409,
                {"url": f"/dashboard/org/{ORG}/outbox/{sent}/retry", "data": {"csrf": good}},
            ),
        ]
        for name, status, kw in cases:
            target = str(kw.pop("url", url))
            resp = c.post(target, **kw)  # type: ignore[arg-type]
            assert resp.status_code == status, name
            assert outbox_states(engine) == before, name
        # The right value without its cookie (another browser, or a cross-site form).
        c.cookies.clear()
        resp = c.post(url, data={"csrf": good})
        assert resp.status_code == 403
        # ...or with another session's cookie.
        c.get(f"/dashboard/org/{ORG}")
        assert c.cookies.get(security.COOKIE) != cookie
        assert c.post(url, data={"csrf": good}).status_code == 403
        assert c.get(url).status_code == 405
        assert outbox_states(engine) == before


def test_token_mode_needs_the_token_for_every_page_and_action(engine: Engine, world: World) -> None:
    row = dead_row(engine)
    with dashboard(engine, world, token=TOKEN) as c:
        before = outbox_states(engine)
        for path in pages(world):
            resp = c.get(path)
            assert resp.status_code == 401, path
            assert 'id="token"' in resp.text  # the sign-in form
            assert security.COOKIE not in resp.headers.get("set-cookie", "")
        # A forged cookie (signed with another key) is no session.
        forged = security.new_session(security.session_key("not-the-token"))
        c.cookies.set(security.COOKIE, forged, path="/dashboard")
        assert c.get(f"/dashboard/org/{ORG}").status_code == 401
        nonce = forged.split(".")[0]
        fake_csrf = security.csrf_token(security.session_key("not-the-token"), nonce)
        resp = c.post(f"/dashboard/org/{ORG}/outbox/{row}/retry", data={"csrf": fake_csrf})
        assert resp.status_code == 401
        c.cookies.clear()
        assert c.post("/dashboard/login", data={"token": "wrong"}).status_code == 401
        assert c.post("/dashboard/login", data={"token": TOKEN[:-1]}).status_code == 401
        assert outbox_states(engine) == before

        # The bearer header works as it does for /metrics.
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        for path in pages(world):
            assert c.get(path, headers=bearer).status_code == 200, path
        c.cookies.clear()

        # Signing in sets a session cookie; then pages and the retry work.
        resp = c.post("/dashboard/login", data={"token": TOKEN})
        assert (resp.status_code, resp.headers["location"]) == (303, "/dashboard/")
        set_cookie = resp.headers["set-cookie"].lower()
        assert "httponly" in set_cookie and "samesite=strict" in set_cookie
        page = c.get(f"/dashboard/org/{ORG}")
        assert page.status_code == 200
        resp = c.post(f"/dashboard/org/{ORG}/outbox/{row}/retry", data={"csrf": csrf_of(page.text)})
        assert resp.status_code == 303
        assert outbox_states(engine)[row] == ("pending", 0)


def test_the_public_listener_does_not_serve_the_dashboard(engine: Engine, world: World) -> None:
    row = dead_row(engine)
    before = outbox_states(engine)
    app = create_app(engine, {ORG: world.cfg})
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        for path in [*pages(world), "/dashboard", "/dashboard/login"]:
            assert c.get(path).status_code == 404, path
        for path in (f"/dashboard/org/{ORG}/outbox/{row}/retry", "/dashboard/login"):
            assert c.post(path, data={"csrf": "x", "token": "x"}).status_code == 404, path
    assert outbox_states(engine) == before


def test_admin_app_without_configs_has_no_dashboard(engine: Engine) -> None:
    with serve_in_thread(create_admin_app(engine, Metrics())) as base:
        assert httpx.get(f"{base}/dashboard/", timeout=10).status_code == 404
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200


def test_retry_is_the_cli_retry(engine: Engine, world: World) -> None:
    """The page's action and `connector outbox retry` share finished.retry_dead: the same SQL
    run twice (page, then the function) finds nothing left to do."""
    from connector.writeback.finished import retry_dead

    row = dead_row(engine)
    with dashboard(engine, world) as c:
        page = c.get(f"/dashboard/org/{ORG}").text
        assert (
            c.post(
                f"/dashboard/org/{ORG}/outbox/{row}/retry", data={"csrf": csrf_of(page)}
            ).status_code
            == 303
        )
    assert retry_dead(engine, ORG) == 0
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox WHERE state = 'dead'")).scalar() == 0
