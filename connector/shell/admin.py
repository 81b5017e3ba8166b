"""The admin listener: ``GET /healthz``, ``GET /metrics`` and the operator's dashboard
(``/dashboard/``), never on the public webhook port.

``connector run`` binds it to 127.0.0.1 by default; anywhere else it needs a bearer token
(``CONNECTOR_ADMIN_TOKEN``), which the dashboard also accepts as a sign-in. Every request
passes ``connector.shell.admin_guard`` (Host allowlist, Origin check, sign-in backoff) and
has its body read in full, capped at ``MAX_BODY_BYTES``, before a route sees it.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Engine, text
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from connector.core import outage
from connector.core.config import OrgConfig
from connector.core.metrics import CONTENT_TYPE, Metrics
from connector.intake.http_server import BufferedBodies
from connector.shell.admin_guard import AdminGuard
from connector.shell.dashboard import dashboard_routes

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
MAX_BODY_BYTES = 16_384
"""The admin listener's request bodies (the sign-in and retry forms) are far smaller."""


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    code = codes.get(exc.status_code, "bad_request")
    return JSONResponse(
        {"error": code, "message": str(exc.detail)}, exc.status_code, headers=exc.headers
    )


def create_admin_app(
    engine: Engine,
    metrics: Metrics,
    *,
    token: str | None = None,
    configs: Mapping[str, OrgConfig] | None = None,
    waiting_for: Callable[[], list[str]] | None = None,
    bound_host: str | None = None,
    extra_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The admin ASGI app: GET /healthz and GET /metrics, and with ``configs`` the dashboard.
    With ``token`` every request needs ``Authorization: Bearer <token>`` (the dashboard also
    takes a session cookie from signing in with it); without, bind it to localhost only.
    ``waiting_for`` names what the process still waits for before it does its work (its
    outbox listener not yet listening, a dispatcher thread gone): /healthz answers 503
    ``not_ready`` with that list until it is empty. Requests must name a loopback host, the
    ``bound_host`` or one of ``extra_hosts`` (default: $CONNECTOR_ADMIN_HOSTS) in ``Host``."""

    def guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Any:
        async def run(request: Request) -> Response:
            given = request.headers.get("authorization", "")
            if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return JSONResponse(
                    {"error": "unauthorized", "message": "bearer token needed"}, 401
                )
            return await endpoint(request)

        return run

    async def healthz(request: Request) -> Response:
        def ping() -> None:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))

        try:
            await run_in_threadpool(ping)
        except Exception as exc:
            if not outage.counted("health checks", exc):
                log.warning("healthz: database check failed: %s", type(exc).__name__)
            return JSONResponse(
                {"status": "unavailable", "error": "database_unavailable"},
                503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        pending = waiting_for() if waiting_for is not None else []
        if pending:
            return JSONResponse(
                {"status": "unavailable", "error": "not_ready", "waiting_for": pending},
                503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        return JSONResponse({"status": "ok"})

    async def metrics_endpoint(request: Request) -> Response:
        body = await run_in_threadpool(metrics.render)
        return Response(body, 200, media_type=CONTENT_TYPE)

    routes: list[Any] = [
        Route("/healthz", guarded(healthz), methods=["GET"]),
        Route("/metrics", guarded(metrics_endpoint), methods=["GET"]),
    ]
    if configs is not None:
        routes += dashboard_routes(engine, configs, admin_token=token)
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error},
        middleware=[
            Middleware(AdminGuard, bound_host=bound_host, extra_hosts=extra_hosts),
            Middleware(BufferedBodies, limit=MAX_BODY_BYTES),
        ],
    )
    app.state.metrics = metrics
    return app
