"""The dashboard's routes on the admin listener: server-rendered HTML, inline SVG charts, no
script and nothing fetched from anywhere else (the Content-Security-Policy says so too)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from connector.core import charts, limits
from connector.core.config import ConfigError, OrgConfig
from connector.notify.dispatch import retry_dead as retry_dead_notifications
from connector.routing.rep_state import SKIP_WORDS
from connector.shell.dashboard import data, figures, security
from connector.shell.reps import away_command, back_command
from connector.writeback.finished import retry_dead

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 4096
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("connector.shell.dashboard", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seconds"] = figures.fmt_seconds
    env.filters["when"] = figures.fmt_time
    env.filters["num"] = charts.fmt_number
    env.filters["share"] = lambda v: f"{v:,.1f}"
    env.filters["iso"] = lambda v: figures.fmt_time(datetime.fromisoformat(v)) if v else "–"
    env.filters["skip"] = lambda v: "eligible" if v is None else f"skipped: {SKIP_WORDS.get(v, v)}"
    return env


def fair_share_chart(window: figures.TeamWindow, title: str, ident: str) -> str:
    bars = [charts.Bar(r.name, r.leads, r.fair_share) for r in window.reps]
    return charts.bar_chart(bars, title=title, ident=ident)


def latency_chart(latency: data.Latency, ident: str) -> str:
    labels = [s.strftime("%H:00") for s in latency.slots]
    return charts.line_chart(
        labels,
        [charts.Series("p50", latency.p50), charts.Series("p99", latency.p99)],
        title="Lead to CRM latency, seconds, per hour (UTC)",
        ident=ident,
        unit=" s",
    )


class _Dashboard:
    """The dashboard's pages for one admin app (its engine, configs and admin token)."""

    def __init__(
        self,
        engine: Engine,
        configs: Mapping[str, OrgConfig],
        admin_token: str | None,
        clock: Callable[[], datetime],
    ) -> None:
        self.engine = engine
        self.configs = configs
        self.admin_token = admin_token
        self.clock = clock
        self.env = _environment()
        self.key = security.session_key(admin_token)

    def authorized(self, request: Request) -> bool:
        if not self.admin_token:
            return True
        if security.bearer_ok(self.admin_token, request.headers.get("authorization", "")):
            return True
        return security.session_nonce(self.key, request.cookies.get(security.COOKIE)) is not None

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        cookie = request.cookies.get(security.COOKIE)
        nonce = security.session_nonce(self.key, cookie)
        fresh = None
        if nonce is None and (not self.admin_token or self.authorized(request)):
            fresh = security.new_session(self.key)
            nonce = security.session_nonce(self.key, fresh)
        body = self.env.get_template(template).render(
            orgs=sorted(self.configs),
            csrf=security.csrf_token(self.key, nonce) if nonce else "",
            token_mode=bool(self.admin_token),
            **context,
        )
        response = HTMLResponse(body, status, headers=HEADERS)
        if fresh is not None:
            _set_cookie(response, fresh)
        return response

    def refuse(self, request: Request, status: int, title: str, message: str) -> Response:
        if status == 401:
            return self.render(request, "login.html", {"error": message}, 401)
        return self.render(request, "message.html", {"title": title, "message": message}, status)

    def org_or_404(self, request: Request) -> OrgConfig | None:
        return self.configs.get(str(request.path_params["org"]))

    async def index(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.refuse(request, 401, "Sign in", "")
        return self.render(request, "index.html", {"configs": self.configs})

    async def org_page(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.refuse(request, 401, "Sign in", "")
        cfg = self.org_or_404(request)
        if cfg is None:
            return self.refuse(request, 404, "Not found", "No such org.")
        view = await run_in_threadpool(data.overview, self.engine, cfg, self.clock())
        retried = request.query_params.get("retried", "")
        renotified = request.query_params.get("renotified", "")
        return self.render(
            request,
            "org.html",
            {
                "org": cfg.org,
                "view": view,
                "retried": _shown_id(retried),
                "renotified": _shown_id(renotified),
                "changed": _changed_rep(cfg, request.query_params),
                "charts": {
                    "today": [
                        fair_share_chart(w, f"{w.team}: leads today vs fair share", f"today-{i}")
                        for i, w in enumerate(view.today)
                    ],
                    "week": [
                        fair_share_chart(w, f"{w.team}: leads in 7 days vs fair share", f"wk-{i}")
                        for i, w in enumerate(view.week)
                    ],
                    "latency": latency_chart(view.latency, "latency"),
                },
            },
        )

    async def totals_page(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.refuse(request, 401, "Sign in", "")
        cfg = self.org_or_404(request)
        if cfg is None:
            return self.refuse(request, 404, "Not found", "No such org.")
        status = await run_in_threadpool(data.totals, self.engine, cfg)
        return self.render(request, "totals.html", {"org": cfg.org, "status": status})

    async def lead_page(self, request: Request) -> Response:
        if not self.authorized(request):
            return self.refuse(request, 401, "Sign in", "")
        cfg = self.org_or_404(request)
        if cfg is None:
            return self.refuse(request, 404, "Not found", "No such org.")
        try:
            lead_id = limits.row_id(request.path_params["lead_id"], "lead id")
        except limits.InputRangeError as exc:
            return self.refuse(request, 400, "Bad request", f"{exc}.")
        return await self._lead(request, cfg, lead_id, f"lead {lead_id}")

    async def _lead(self, request: Request, cfg: OrgConfig, lead_id: int, named: str) -> Response:
        story = await run_in_threadpool(data.lead_story, self.engine, cfg, lead_id)
        if story is None:
            return self.refuse(request, 404, "Not found", f"Org {cfg.org} has no {named}.")
        return self.render(request, "lead.html", {"org": cfg.org, "story": story})

    async def lead_by_crm_id(self, request: Request) -> Response:
        """/lead/crm/<CRM id>: the lead page of a record, by any form of its CRM id."""
        if not self.authorized(request):
            return self.refuse(request, 401, "Sign in", "")
        cfg = self.org_or_404(request)
        if cfg is None:
            return self.refuse(request, 404, "Not found", "No such org.")
        given = str(request.path_params["crm_id"])
        try:
            lead_id = await run_in_threadpool(data.lead_by_crm_id, self.engine, cfg, given)
        except data.BadCrmId as exc:
            return self.refuse(request, 400, "Bad request", f"{exc}.")
        if lead_id is None:
            return self.refuse(
                request, 404, "Not found", f"Org {cfg.org} has no lead with CRM id {given!r}."
            )
        return await self._lead(request, cfg, lead_id, f"lead {lead_id}")

    async def lead_search(self, request: Request) -> Response:
        """The search box: GET ?crm_id=... goes to that record's /lead/crm/ page."""
        if not self.authorized(request):
            return self.refuse(request, 401, "Sign in", "")
        cfg = self.org_or_404(request)
        if cfg is None:
            return self.refuse(request, 404, "Not found", "No such org.")
        given = request.query_params.get("crm_id", "").strip()
        if not given or len(given) > data.MAX_CRM_ID or not given.isprintable():
            return self.refuse(
                request,
                400,
                "Bad request",
                f"a CRM record id has 1 to {data.MAX_CRM_ID} printable characters.",
            )
        return RedirectResponse(f"/dashboard/org/{cfg.org}/lead/crm/{quote(given, safe='')}", 303)

    async def rep_action(self, request: Request) -> Response:
        """POST .../rep/<rep>/away (until, reason) or .../back: what `connector rep away` and
        `connector rep back` do, through the same functions."""
        who, action = str(request.path_params["rep"]), str(request.path_params["action"])
        if action not in ("away", "back"):
            return self.refuse(request, 404, "Not found", "No such action.")
        checked = await self._checked_form(request)
        if isinstance(checked, Response):
            return checked
        cfg, form = checked
        now = self.clock()
        try:
            if action == "away":
                rep, until = await run_in_threadpool(
                    away_command,
                    self.engine,
                    cfg,
                    who,
                    form.get("until"),
                    form.get("reason") or None,
                    now,
                )
                log.info("dashboard: org %s rep %s away until %s", cfg.org, rep.crm_user_id, until)
                done = "away"
            else:
                rep, ended = await run_in_threadpool(back_command, self.engine, cfg, who)
                log.info("dashboard: org %s rep %s back", cfg.org, rep.crm_user_id)
                done = "back" if ended else "not_away"
        except ConfigError as exc:  # the command's own message (its option names included)
            return self.refuse(request, 400, "Not changed", str(exc))
        target = f"/dashboard/org/{cfg.org}?rep={quote(rep.crm_user_id, safe='')}&did={done}"
        return RedirectResponse(target + "#reps", 303)

    async def _checked_form(self, request: Request) -> tuple[OrgConfig, dict[str, str]] | Response:
        """The org and form of an authorized POST with a valid CSRF value, else the refusal."""
        if not self.authorized(request):
            return self.refuse(request, 401, "Sign in", "Sign in with the admin token first.")
        form = await _form(request)
        if form is None:
            return self.refuse(request, 400, "Bad request", "The form was too large or malformed.")
        if not security.csrf_ok(self.key, request.cookies.get(security.COOKIE), form.get("csrf")):
            return self.refuse(
                request, 403, "Refused", "The form's CSRF value is missing or wrong: reload."
            )
        cfg = self.org_or_404(request)
        if cfg is None:
            return self.refuse(request, 404, "Not found", "No such org.")
        return cfg, form

    async def retry(self, request: Request) -> Response:
        return await self._retry(request, "outbox")

    async def retry_notification(self, request: Request) -> Response:
        return await self._retry(request, "notification")

    async def _retry(self, request: Request, what: str) -> Response:
        """Requeue one dead outbox row or notification (its own short transaction)."""
        checked = await self._checked_form(request)
        if isinstance(checked, Response):
            return checked
        cfg, _form = checked
        try:
            row_id = limits.row_id(request.path_params["row_id"], f"{what} row id")
        except limits.InputRangeError as exc:
            return self.refuse(request, 400, "Bad request", f"{exc}.")
        requeue = retry_dead if what == "outbox" else retry_dead_notifications
        n = await run_in_threadpool(requeue, self.engine, cfg.org, [row_id])
        label = "Outbox row" if what == "outbox" else "Notification"
        if n == 0:
            return self.refuse(
                request, 409, "Not retried", f"{label} {row_id} of {cfg.org} is not dead."
            )
        log.info("dashboard: org %s %s %d requeued", cfg.org, what, row_id)
        if what == "outbox":
            return RedirectResponse(f"/dashboard/org/{cfg.org}?retried={row_id}#dead", 303)
        return RedirectResponse(
            f"/dashboard/org/{cfg.org}?renotified={row_id}#dead-notifications", 303
        )

    async def login_form(self, request: Request) -> Response:
        if self.authorized(request):
            return RedirectResponse("/dashboard/", 303)
        return self.render(request, "login.html", {"error": ""})

    async def login(self, request: Request) -> Response:
        if not self.admin_token:
            return RedirectResponse("/dashboard/", 303)
        form = await _form(request)
        given = (form or {}).get("token", "")
        if not security.bearer_ok(self.admin_token, f"Bearer {given}"):
            return self.render(
                request, "login.html", {"error": "That is not the admin token."}, 401
            )
        response = RedirectResponse("/dashboard/", 303)
        _set_cookie(response, security.new_session(self.key))
        return response


def dashboard_routes(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    *,
    admin_token: str | None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> list[BaseRoute]:
    """GET /dashboard/..., POST .../retry, .../rep/<rep>/away|back and /dashboard/login, for
    the admin app."""
    d = _Dashboard(engine, configs, admin_token, clock)
    return [
        Route("/dashboard", lambda r: RedirectResponse("/dashboard/", 308), methods=["GET"]),
        Route("/dashboard/", d.index, methods=["GET"]),
        Route("/dashboard/login", d.login_form, methods=["GET"]),
        Route("/dashboard/login", d.login, methods=["POST"]),
        Route("/dashboard/org/{org}", d.org_page, methods=["GET"]),
        Route("/dashboard/org/{org}/totals", d.totals_page, methods=["GET"]),
        Route("/dashboard/org/{org}/lead/{lead_id:int}", d.lead_page, methods=["GET"]),
        Route("/dashboard/org/{org}/lead/crm/{crm_id}", d.lead_by_crm_id, methods=["GET"]),
        Route("/dashboard/org/{org}/lead", d.lead_search, methods=["GET"]),
        Route("/dashboard/org/{org}/rep/{rep}/{action:str}", d.rep_action, methods=["POST"]),
        Route("/dashboard/org/{org}/outbox/{row_id:int}/retry", d.retry, methods=["POST"]),
        Route(
            "/dashboard/org/{org}/notifications/{row_id:int}/retry",
            d.retry_notification,
            methods=["POST"],
        ),
    ]


def _changed_rep(cfg: OrgConfig, query: Mapping[str, str]) -> str | None:
    """The note after an Away or Back button: what was done, for a rep of the config."""
    who, did = query.get("rep", ""), query.get("did", "")
    names = {m.crm_user_id: m.name for t in cfg.teams for m in t.members}
    if who not in names:
        return None
    return {
        "away": f"{names[who]} ({who}) is away: no lead until the time shown below.",
        "back": f"{names[who]} ({who}) is back.",
        "not_away": f"{names[who]} ({who}) had no time off set from the command line.",
    }.get(did)


def _shown_id(value: str) -> int | None:
    """A row id a link carries for display only (``?retried=``), None when it is not one."""
    try:
        return limits.row_id(value)
    except limits.InputRangeError:
        return None


def _set_cookie(response: Response, value: str) -> None:
    response.set_cookie(security.COOKIE, value, httponly=True, samesite="strict", path="/dashboard")


async def _form(request: Request) -> dict[str, str] | None:
    """An urlencoded form of at most MAX_FORM_BYTES (one value per field; an empty body is
    an empty form), else None."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    if not body:
        return {}
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        return None
    try:
        parsed = parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return None
    return {k: v[0] for k, v in parsed.items()}
