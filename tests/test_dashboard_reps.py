"""The dashboard's reps and lead lookup over real HTTP on a real database: each rep's state now
(the same as `connector status`), Away and Back (the functions `connector rep away|back`
run) with every refusal (exact status and message, nothing stored), a lead found by any form
of its CRM id, and the lead page's candidates with their skip reasons (explain's data)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import Engine, text

from connector.core.metrics import Metrics
from connector.routing.assign import Lead, Router
from connector.shell.admin import create_admin_app
from connector.shell.dashboard import security
from connector.shell.explain import load_explanation
from connector.shell.reps import resolve_rep, set_away
from connector.shell.service import serve_in_thread
from connector.shell.status import org_status
from crm_sandboxes import SalesforceSandbox
from tests.helpers.dashboard_world import ORG, World, build_world

TOKEN = "admin-token-for-the-dashboard-0123"


@pytest.fixture
def world(engine: Engine, sf: SalesforceSandbox) -> World:
    return build_world(engine, sf)


@contextmanager
def dashboard(engine: Engine, world: World, token: str | None = None) -> Iterator[httpx.Client]:
    app = create_admin_app(engine, Metrics(), token=token, configs={ORG: world.cfg})
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield client


def csrf_of(page: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert m, "no CSRF value in the page"
    return m.group(1)


def time_off(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text("SELECT org, crm_user_id, until, reason FROM rep_time_off ORDER BY 2")
            )
        ]


def shown_states(page: str) -> dict[tuple[str, str], str]:
    """(team, crm user id) -> the "Now" cell of the reps tables."""
    out = {}
    for team, body in re.findall(
        r'<table data-list="reps" data-team="([^"]+)">(.*?)</table>', page, re.S
    ):
        for rep, now in re.findall(
            r'<tr data-rep="([^"]+)">.*?data-figure="now">([^<]*)<', body, re.S
        ):
            out[(team, rep)] = html.unescape(now)
    return out


def test_reps_now_are_the_status_states(engine: Engine, world: World) -> None:
    set_away(
        engine,
        world.cfg,
        resolve_rep(world.cfg, "Grace Hopper"),
        datetime(2099, 1, 1, tzinfo=UTC),
        "PTO",
        datetime.now(UTC),
    )
    status = org_status(engine, world.cfg)
    with dashboard(engine, world) as c:
        page = c.get(f"/dashboard/org/{ORG}").text
    expected = {
        (t["name"], m["crm_user_id"]): m["now"]["text"]
        for t in status["teams"]
        for m in t["members"]
    }
    assert shown_states(page) == expected
    assert expected[("americas", world.reps[2])] == (
        "away until 2099-01-01 00:00 UTC (PTO, command line)"
    )


def test_away_and_back_round_trip(engine: Engine, world: World) -> None:
    ada = world.reps[0]
    with dashboard(engine, world) as c:
        csrf = csrf_of(c.get(f"/dashboard/org/{ORG}").text)
        resp = c.post(
            f"/dashboard/org/{ORG}/rep/{ada}/away",
            data={"csrf": csrf, "until": "2099-03-01T09:30", "reason": "conference"},
        )
        assert resp.status_code == 303
        assert resp.headers["location"] == f"/dashboard/org/{ORG}?rep={ada}&did=away#reps"
        assert time_off(engine) == [
            (ORG, ada, datetime(2099, 3, 1, 9, 30, tzinfo=UTC), "conference")
        ]
        page = c.get(resp.headers["location"]).text
        assert f"Ada Lovelace ({ada}) is away" in page
        assert shown_states(page)[("americas", ada)] == (
            "away until 2099-03-01 09:30 UTC (conference, command line)"
        )
        resp = c.post(f"/dashboard/org/{ORG}/rep/{ada}/back", data={"csrf": csrf})
        assert resp.status_code == 303
        assert resp.headers["location"] == f"/dashboard/org/{ORG}?rep={ada}&did=back#reps"
        assert time_off(engine) == []
        page = c.get(resp.headers["location"]).text
        assert f"Ada Lovelace ({ada}) is back." in page
        assert shown_states(page)[("americas", ada)] == "available"
        # Back again: nothing to end, said so
        resp = c.post(f"/dashboard/org/{ORG}/rep/{ada}/back", data={"csrf": csrf})
        page = c.get(resp.headers["location"]).text
        assert "had no time off set from the command line" in page


def test_rep_action_refusals_change_nothing(engine: Engine, world: World) -> None:
    ada = world.reps[0]
    away = f"/dashboard/org/{ORG}/rep/{ada}/away"
    with dashboard(engine, world) as c:
        good = csrf_of(c.get(f"/dashboard/org/{ORG}").text)
        ok = {"csrf": good, "until": "2099-01-01T09:00"}
        cases: list[tuple[str, int, str, dict[str, object]]] = [
            ("no csrf", 403, "The form&#39;s CSRF value is missing or wrong", {"data": {}}),
            (
                "wrong csrf",
                403,
                "CSRF value is missing or wrong",
                {"data": {**ok, "csrf": "0" * 64}},
            ),
            ("csrf in the query", 403, "CSRF", {"params": {"csrf": good}, "data": {}}),
            ("json body", 400, "The form was too large or malformed.", {"json": ok}),
            ("oversized", 400, "too large", {"data": {**ok, "reason": "x" * 5000}}),
            (
                "no until",
                400,
                "rep away: --until is required (e.g. --until 2026-12-24T09:00)",
                {"data": {"csrf": good}},
            ),
            (
                "until in the past",
                400,
                "--until &#39;2001-01-01T09:00&#39; is not in the future",
                {"data": {**ok, "until": "2001-01-01T09:00"}},
            ),
            (
                "not a date",
                400,
                "--until: &#39;soon&#39; is not a date or date-time like 2026-12-24T09:00",
                {"data": {**ok, "until": "soon"}},
            ),
            (
                "reason on two lines",
                400,
                "--reason: must be 1 to 200 printable characters on one line",
                {"data": {**ok, "reason": "a\nb"}},
            ),
            (
                "unknown rep",
                400,
                f"org {ORG}: no rep &#39;nobody&#39; in the config",
                {"url": f"/dashboard/org/{ORG}/rep/nobody/away", "data": ok},
            ),
            (
                "unknown action",
                404,
                "No such action.",
                {"url": f"/dashboard/org/{ORG}/rep/{ada}/delete", "data": ok},
            ),
            (
                "other org",
                404,
                "No such org.",
                {"url": f"/dashboard/org/nope/rep/{ada}/away", "data": ok},
            ),
        ]
        for name, status, message, kw in cases:
            target = str(kw.pop("url", away))
            resp = c.post(target, **kw)  # type: ignore[arg-type]
            assert resp.status_code == status, name
            assert message in resp.text, (name, resp.text[-600:])
            assert time_off(engine) == [], name
        assert c.get(away).status_code == 405
        # the right value without its cookie (a cross-site form) or with another session's
        c.cookies.clear()
        assert c.post(away, data=ok).status_code == 403
        c.get(f"/dashboard/org/{ORG}")
        assert c.post(away, data=ok).status_code == 403
        assert c.post(f"/dashboard/org/{ORG}/rep/{ada}/back", data=ok).status_code == 403
    assert time_off(engine) == []


def test_rep_actions_and_lookup_need_the_token(engine: Engine, world: World) -> None:
    ada = world.reps[0]
    with dashboard(engine, world, token=TOKEN) as c:
        for path in (
            f"/dashboard/org/{ORG}/lead/crm/{world.pushed_crm_id}",
            f"/dashboard/org/{ORG}/lead?crm_id={world.pushed_crm_id}",
        ):
            resp = c.get(path)
            assert resp.status_code == 401 and 'id="token"' in resp.text, path
            assert world.pushed_crm_id not in resp.text, path
        forged = security.new_session(security.session_key("not-the-token"))
        c.cookies.set(security.COOKIE, forged, path="/dashboard")
        csrf = security.csrf_token(security.session_key("not-the-token"), forged.split(".")[0])
        resp = c.post(
            f"/dashboard/org/{ORG}/rep/{ada}/away", data={"csrf": csrf, "until": "2099-01-01"}
        )
        assert resp.status_code == 401
        assert time_off(engine) == []
        c.cookies.clear()
        c.post("/dashboard/login", data={"token": TOKEN})
        csrf = csrf_of(c.get(f"/dashboard/org/{ORG}").text)
        resp = c.post(
            f"/dashboard/org/{ORG}/rep/{ada}/away", data={"csrf": csrf, "until": "2099-01-01"}
        )
        assert resp.status_code == 303 and [r[1] for r in time_off(engine)] == [ada]


def test_lead_by_crm_id_in_any_form(engine: Engine, world: World) -> None:
    crm_id = world.pushed_crm_id
    lead = world.lead_ids[crm_id]
    assert len(crm_id) == 18
    with dashboard(engine, world) as c:
        for given in (crm_id, crm_id[:15], crm_id.lower(), f" {crm_id} "):
            resp = c.get(f"/dashboard/org/{ORG}/lead/crm/{given}")
            assert resp.status_code == 200, given
            assert f"<h1>Lead {lead} " in resp.text and crm_id in resp.text
        # the search box: a GET form that goes to the record's URL
        resp = c.get(f"/dashboard/org/{ORG}/lead", params={"crm_id": crm_id[:15]})
        assert resp.status_code == 303
        assert resp.headers["location"] == f"/dashboard/org/{ORG}/lead/crm/{crm_id[:15]}"
        assert (
            'action="/dashboard/org/dash/lead" role="search"' in c.get(f"/dashboard/org/{ORG}").text
        )
        unknown = "00QSB0000009999"  # a well-formed id of no lead
        resp = c.get(f"/dashboard/org/{ORG}/lead/crm/{unknown}")
        assert resp.status_code == 404
        assert f"Org {ORG} has no lead with CRM id &#39;{unknown}&#39;." in resp.text
        resp = c.get(f"/dashboard/org/{ORG}/lead/crm/not-an-id")
        assert resp.status_code == 400
        assert "&#39;not-an-id&#39; is not a Salesforce record id." in resp.text
        resp = c.get(f"/dashboard/org/{ORG}/lead", params={"crm_id": ""})
        assert resp.status_code == 400
        assert "a CRM record id has 1 to 64 printable characters." in resp.text
        resp = c.get(f"/dashboard/org/{ORG}/lead", params={"crm_id": "x" * 65})
        assert resp.status_code == 400
        # self-contained like every page: local links and forms only, no script
        body = c.get(f"/dashboard/org/{ORG}/lead/crm/{crm_id[:15]}").text
        for ref in re.findall(r'(?:href|src|action)="([^"]*)"', body):
            assert ref.startswith("/dashboard/"), ref
        assert "<script" not in body and "http:" not in body
        assert c.get(f"/dashboard/org/nope/lead/crm/{crm_id}").status_code == 404


def test_lead_page_shows_explain_candidates_and_skip_reasons(
    engine: Engine, world: World, sf: SalesforceSandbox
) -> None:
    """A lead routed while Grace is away and Ada off the rotation's turn: its page lists
    every candidate of the team with the reason it was skipped, as `connector explain`."""
    set_away(
        engine,
        world.cfg,
        resolve_rep(world.cfg, "Grace Hopper"),
        datetime(2099, 1, 1, tzinfo=UTC),
        None,
        datetime.now(UTC),
    )
    crm_id = sf.add_record("Lead", fields={"Country": "US"})
    Router(engine, world.cfg).assign_many([Lead(crm_id, {"Country": "US"})], "import")
    explained = load_explanation(engine, world.cfg, crm_id)["decisions"][-1]
    skips = {c["crm_user_id"]: c["skip"] for c in explained["candidates"]}
    assert skips[world.reps[2]] == "away"
    chosen = explained["chosen"]["crm_user_id"]
    with dashboard(engine, world) as c:
        page = c.get(f"/dashboard/org/{ORG}/lead/crm/{crm_id}").text
    table = re.search(r'<table data-list="candidates">(.*?)</table>', page, re.S)
    assert table
    shown = dict(
        re.findall(r'<tr data-rep="([^"]+)">.*?data-figure="skip">([^<]*)<', table.group(1), re.S)
    )
    words = {None: "eligible", "away": "skipped: away"}
    assert shown == {
        rep: words[s] + (", chosen" if rep == chosen else "") for rep, s in skips.items()
    }
    assert "How it was routed" in page and "Chosen: " in page
