"""HTTP receivers for CRM pushes (Salesforce Outbound Messages, HubSpot v3 webhooks), health
and metrics.

Every delivery is answered only after the transaction that stored it committed, so an
acknowledged delivery is never lost and a refused one stored nothing (the CRM retries it).
Bodies are read with a hard cap while streaming; bad input gets a precise 4xx with a stable
error code (JSON, or a SOAP fault on the Salesforce endpoint); a database outage gets a 503
with Retry-After. Logs carry event, notification and lead ids only, never field values,
tokens or bodies.

HubSpot events carry an object id and at most one property, so routing usually needs the
record's fields from the CRM. Calling the CRM inside the request would hold the answer (HubSpot
gives 5 s) and calling it inside a transaction is forbidden, so with a ``fetcher`` the events
are committed to the durable ``webhook_inbox`` table in one short transaction and answered at
once; an ``InboxWorker`` thread (started by the app's lifespan, safe in any number of
processes: SKIP LOCKED claims with a lease) fetches the records with no transaction open, then
routes them and marks the rows done in one transaction. Without a fetcher, the leads are routed
in the request with the properties the events carried, in the same transaction that records
the events.

Run it: ``uvicorn --factory connector.web:app_from_env --host 0.0.0.0 --port 8080`` with
``CONNECTOR_CONFIG`` (and ``DATABASE_URL``) set; behind a TLS-terminating proxy also set
``CONNECTOR_PUBLIC_BASE_URL`` (e.g. ``https://hooks.example.com``), the base of the URL HubSpot
signs. Without it the signed URL is rebuilt from the scheme uvicorn reports and the Host header;
pass ``--no-proxy-headers`` unless a trusted proxy sets X-Forwarded-Proto.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import db
from connector.config import HubSpotCrm, OrgConfig, SalesforceCrm
from connector.hubspot_events import (
    EventError,
    HubSpotEvent,
    dedupe_latest,
    lead_events,
    parse_events,
)
from connector.metrics import CONTENT_TYPE, Metrics
from connector.routing import Lead, LeadError, Outcome, Router, RoutingError, validate_lead
from connector.signatures import SIGNATURE_HEADER, TIMESTAMP_HEADER, SignatureError, verify_v3
from connector.soap import (
    SoapError,
    ack_response,
    parse_outbound_message,
    soap_fault,
)
from crm_adapters.salesforce_ids import same_id as same_salesforce_id

log = logging.getLogger(__name__)

Fetcher = Callable[[OrgConfig, Sequence[str]], Mapping[str, Mapping[str, Any]]]
"""``(cfg, crm_ids) -> {crm_id: fields}`` for the records that exist; called with no
transaction open. Raising means "try again later"; an id missing from the answer means the
record is gone (its inbox row is marked skipped)."""

HUBSPOT_OBJECT_TYPE_IDS = {"contacts": "0-1", "leads": "0-136"}
RETRY_AFTER_SECONDS = 5
SOAP_CONTENT_TYPE = "text/xml; charset=utf-8"

_INBOX_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("inbox").items()}


class ApiError(Exception):
    """A refused request: HTTP status, a stable code, and a message safe to send and log."""

    def __init__(
        self, status: int, code: str, message: str, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


# --- request helpers ------------------------------------------------------------------------


async def read_capped(request: Request, limit: int) -> bytes:
    """The body, refusing (413) as soon as more than ``limit`` bytes arrived.

    A Content-Length over the cap is refused before reading; a smaller (or absent, chunked)
    one is not trusted: the count is of the bytes actually received.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "body_too_large", f"body exceeds {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "client_disconnected", "the client closed the request") from None
    return b"".join(chunks)


def signed_uri(request: Request, public_base_url: str | None) -> str:
    """The URL as HubSpot called it: scheme://host + path + query, path exactly as sent.

    Behind a proxy the scheme and host HubSpot used are not the ones this process sees; then
    ``public_base_url`` supplies them (forwarding headers are not trusted).
    """
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    path = raw.decode("latin-1").partition("?")[0]
    query = request.scope.get("query_string", b"").decode("latin-1")
    if public_base_url:
        base = public_base_url.rstrip("/")
    else:
        host = request.headers.get("host") or ""
        base = f"{request.url.scheme}://{host}"
    return f"{base}{path}?{query}" if query else f"{base}{path}"


def _db_errors(exc: Exception) -> ApiError | None:
    """Translate a database or routing-state failure into the answer to give, if it is one."""
    if isinstance(exc, OperationalError | PoolTimeoutError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return ApiError(
            503, "database_unavailable", "the database is unavailable", RETRY_AFTER_SECONDS
        )
    if isinstance(exc, RoutingError):
        return ApiError(
            503, "routing_not_ready", "routing state is not applied", RETRY_AFTER_SECONDS
        )
    if isinstance(exc, SQLAlchemyError):
        return ApiError(500, "database_error", "the database refused the transaction")
    return None


# --- the inbox worker ------------------------------------------------------------------------


@dataclass(frozen=True)
class InboxRow:
    id: int
    crm_id: str
    fields: Mapping[str, Any]


class InboxWorker:
    """Drains ``webhook_inbox``: claim (short transaction), fetch (no transaction), route and
    mark done (one transaction). Any number of workers in any number of processes may run."""

    def __init__(
        self,
        engine: Engine,
        configs: Mapping[str, OrgConfig],
        routers: Mapping[str, Router],
        fetcher: Fetcher,
        metrics: Metrics,
        *,
        batch_size: int = 100,
        lease_seconds: float = 120.0,
        max_attempts: int = 10,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        poll_interval: float = 1.0,
    ) -> None:
        self.engine = engine
        self.configs = {k: v for k, v in configs.items() if isinstance(v.crm, HubSpotCrm)}
        self.routers = routers
        self.fetcher = fetcher
        self.metrics = metrics
        self.batch_size = batch_size
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.poll_interval = poll_interval
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="inbox-worker", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.drain_once()
            except Exception as exc:  # keep the worker alive; the lease rescues claimed rows
                log.warning("inbox worker: %s", type(exc).__name__)
                done = 0
            if done == 0:
                self._wake.wait(self.poll_interval)
                self._wake.clear()

    def drain_once(self) -> int:
        """Process one claim per org; the number of inbox rows handled."""
        handled = 0
        for org in sorted(self.configs):
            rows = self._claim(org)
            if rows:
                self._process(self.configs[org], rows)
                handled += len(rows)
        return handled

    def _claim(self, org: str) -> list[InboxRow]:
        with self.engine.begin() as conn:
            result = conn.execute(
                _INBOX_SQL["claim"],
                {
                    "org": org,
                    "worker": self.worker_id,
                    "lease_seconds": self.lease_seconds,
                    "limit": self.batch_size,
                },
            ).all()
        return [InboxRow(r.id, r.crm_id, r.fields) for r in result]

    def _finish(self, conn: Connection, ids: list[int], state: str, note: str | None) -> None:
        if ids:
            conn.execute(
                _INBOX_SQL["finish"],
                {"ids": ids, "state": state, "note": note, "worker": self.worker_id},
            )

    def _retry_later(self, rows: list[InboxRow], error: str) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    _INBOX_SQL["retry_later"],
                    {
                        "ids": [r.id for r in rows],
                        "worker": self.worker_id,
                        "max_attempts": self.max_attempts,
                        "base_delay": self.base_delay,
                        "max_delay": self.max_delay,
                        "error": error,
                    },
                )
        except SQLAlchemyError as exc:
            log.warning("inbox: cannot reschedule (%s); the lease will", type(exc).__name__)

    def _process(self, cfg: OrgConfig, rows: list[InboxRow]) -> None:
        ids = list(dict.fromkeys(r.crm_id for r in rows))
        try:
            fetched = self.fetcher(cfg, ids)  # no transaction is open here
        except Exception as exc:
            code = str(getattr(exc, "code", "") or type(exc).__name__)[:100]
            self.metrics.crm_errors.labels(cfg.org, code).inc()
            log.warning("inbox: fetch for org %s failed (%s); will retry", cfg.org, code)
            self._retry_later(rows, f"fetch failed: {code}")
            return
        finally:
            self.metrics.crm_calls.labels(cfg.org, "fetch_records").inc()
        leads: list[Lead] = []
        done: list[int] = []
        missing: list[int] = []
        invalid: dict[str, list[int]] = {}
        for row in rows:
            fields = fetched.get(row.crm_id)
            if fields is None:
                missing.append(row.id)
                continue
            try:
                leads.append(validate_lead(row.crm_id, {**row.fields, **fields}))
                done.append(row.id)
            except LeadError as exc:
                invalid.setdefault(exc.reason, []).append(row.id)
        try:
            with self.engine.begin() as conn:
                outcomes = self.routers[cfg.org].assign_in(conn, leads, "hubspot_webhook")
                self._finish(conn, done, "done", None)
                self._finish(conn, missing, "skipped", "record not found in the CRM")
                for reason, bad in invalid.items():
                    self._finish(conn, bad, "dead", reason)
        except (SQLAlchemyError, RoutingError) as exc:
            # Rolled back; back off (and dead-letter after max_attempts). If even that
            # fails (database down), the lease expires and another claim rescues the rows.
            log.warning("inbox: routing for org %s failed: %s", cfg.org, type(exc).__name__)
            self._retry_later(rows, f"routing failed: {type(exc).__name__}")
            return
        _count_outcomes(self.metrics, cfg.org, "hubspot_webhook", outcomes)
        log.info(
            "inbox: org %s routed %s, skipped %d missing, %d invalid",
            cfg.org,
            [o.crm_id for o in outcomes],
            len(missing),
            sum(len(v) for v in invalid.values()),
        )


def _count_outcomes(metrics: Metrics, org: str, source: str, outcomes: Sequence[Outcome]) -> None:
    for o in outcomes:
        metrics.leads_ingested.labels(source, o.status).inc()
        if o.status == "assigned" and o.team:
            metrics.assignments.labels(org, o.team).inc()


# --- the app ----------------------------------------------------------------------------


def _merged_fields(
    events: Sequence[HubSpotEvent],
) -> dict[tuple[int, str | None, int], dict[str, Any]]:
    """Per object, the properties its events carried; a later event's value wins."""
    out: dict[tuple[int, str | None, int], dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: e.occurred_at):
        fields = out.setdefault((e.portal_id, e.object_type, e.object_id), {})
        if e.property_name:
            fields[e.property_name] = e.property_value
    return out


class _App:
    def __init__(
        self,
        engine: Engine,
        configs: Mapping[str, OrgConfig],
        fetcher: Fetcher | None,
        clock: Callable[[], float],
        public_base_url: str | None,
        inbox_lease_seconds: float = 120.0,
    ) -> None:
        self.engine = engine
        self.configs = dict(configs)
        self.fetcher = fetcher
        self.clock = clock
        self.public_base_url = public_base_url
        self.routers = {org: Router(engine, cfg) for org, cfg in self.configs.items()}
        self.metrics = Metrics(engine, self.configs)
        self.worker = (
            InboxWorker(
                engine,
                self.configs,
                self.routers,
                fetcher,
                self.metrics,
                lease_seconds=inbox_lease_seconds,
            )
            if fetcher is not None
            else None
        )

    # -- shared ----------------------------------------------------------------------------

    def _observe(self, endpoint: str, started: float, status: int) -> None:
        self.metrics.webhook_requests.labels(endpoint, str(status)).inc()
        self.metrics.webhook_latency.labels(endpoint).observe(time.perf_counter() - started)

    def _org(self, org: str, kind: str) -> OrgConfig:
        cfg = self.configs.get(org)
        if cfg is None or cfg.crm.kind != kind:
            # Same answer for both, so the endpoint does not reveal which orgs exist.
            raise ApiError(404, "unknown_org", f"no {kind} org is configured under this path")
        return cfg

    async def _in_db(self, fn: Callable[[], Any]) -> Any:
        try:
            return await run_in_threadpool(fn)
        except Exception as exc:
            mapped = _db_errors(exc)
            if mapped is None:
                raise
            log.error("database failure: %s", type(exc).__name__)
            raise mapped from None

    # -- Salesforce ------------------------------------------------------------------------

    async def _answer(
        self,
        endpoint: str,
        handler: Callable[[Request], Awaitable[Response]],
        render_error: Callable[[ApiError], Response],
        request: Request,
    ) -> Response:
        """Run a webhook handler: every failure becomes a rendered error, every answer is
        counted and timed."""
        started = time.perf_counter()
        try:
            response = await handler(request)
        except ApiError as exc:
            response = render_error(exc)
        except Exception:
            log.exception("%s webhook: unexpected failure", endpoint)
            response = render_error(ApiError(500, "internal_error", "internal error"))
        self._observe(endpoint, started, response.status_code)
        return response

    async def salesforce(self, request: Request) -> Response:
        return await self._answer("salesforce", self._salesforce, _soap_error, request)

    async def _salesforce(self, request: Request) -> Response:
        cfg = self._org(request.path_params["org"], "salesforce")
        crm = cfg.crm
        assert isinstance(crm, SalesforceCrm)
        if not crm.organization_id:
            raise ApiError(
                403,
                "organization_id_not_configured",
                "crm.organization_id must be configured to accept Outbound Messages",
            )
        limit = cfg.webhook.max_body_bytes
        body = await read_capped(request, limit)
        try:
            message = parse_outbound_message(body, max_bytes=limit)
        except SoapError as exc:
            raise ApiError(exc.http_status, exc.code, exc.message) from None
        if not same_salesforce_id(message.organization_id, crm.organization_id):
            raise ApiError(403, "wrong_organization", "OrganizationId does not match this org")
        leads: list[Lead] = []
        for i, n in enumerate(message.notifications):
            if n.sobject_type != crm.object:
                raise ApiError(
                    400,
                    "wrong_sobject_type",
                    f"Notification {i}: sObject is {n.sobject_type}, expected {crm.object}",
                )
            try:
                leads.append(validate_lead(n.sobject_id, n.fields))
            except LeadError as exc:
                raise ApiError(400, "invalid_lead", f"Notification {i}: {exc.reason}") from None
        router = self.routers[cfg.org]

        def store() -> list[Outcome]:
            with self.engine.begin() as conn:
                return router.assign_in(conn, leads, "salesforce_outbound")

        outcomes: list[Outcome] = await self._in_db(store)
        # Committed: only now may Salesforce stop retrying.
        _count_outcomes(self.metrics, cfg.org, "salesforce_outbound", outcomes)
        log.info(
            "salesforce org %s: notifications %s -> leads %s",
            cfg.org,
            [n.notification_id for n in message.notifications],
            [f"{o.crm_id}:{o.status}" for o in outcomes],
        )
        return Response(ack_response(), 200, media_type=SOAP_CONTENT_TYPE)

    # -- HubSpot ---------------------------------------------------------------------------

    async def hubspot(self, request: Request) -> Response:
        return await self._answer("hubspot", self._hubspot, _json_error, request)

    async def _hubspot(self, request: Request) -> Response:
        cfg = self._org(request.path_params["org"], "hubspot")
        crm = cfg.crm
        assert isinstance(crm, HubSpotCrm)
        secrets = [s.get_secret_value() for s in crm.webhook_secrets if s.get_secret_value()]
        if not secrets:
            raise ApiError(
                401,
                "webhook_secret_not_configured",
                "crm.webhook_secrets must be configured to accept HubSpot webhooks",
            )
        limit = cfg.webhook.max_body_bytes
        body = await read_capped(request, limit)
        try:
            verify_v3(
                secrets,
                request.method,
                signed_uri(request, self.public_base_url),
                body,
                request.headers.get(SIGNATURE_HEADER),
                request.headers.get(TIMESTAMP_HEADER),
                int(self.clock() * 1000),
            )
            events = parse_events(body, max_bytes=limit)
        except (SignatureError, EventError) as exc:
            raise ApiError(exc.http_status, exc.code, exc.message) from None
        kept = lead_events(
            events,
            routed_properties=crm.routed_properties,
            object_type_ids={HUBSPOT_OBJECT_TYPE_IDS[crm.object]},
        )
        fields_by_object = _merged_fields(kept)
        latest = dedupe_latest(kept)
        leads: list[Lead] = []
        for e in latest:
            try:
                fields = fields_by_object[(e.portal_id, e.object_type, e.object_id)]
                leads.append(validate_lead(str(e.object_id), fields))
            except LeadError as exc:
                raise ApiError(400, "invalid_lead", f"event {e.event_id}: {exc.reason}") from None
        ignored = len(events) - len(kept)
        self.metrics.webhook_events.labels(cfg.org, "ignored").inc(ignored)
        if not latest:
            return JSONResponse({"events": len(events), "routed": 0, "queued": 0})

        # Only an org whose rules need the record's fields (crm.fetch_properties) goes through
        # the inbox and the fetch; the others are routed in this request's transaction.
        worker = self.worker if self.worker is not None and crm.fetch_properties else None
        params = {
            "org": cfg.org,
            "crm_object": cfg.crm_object,
            "state": "pending" if worker is not None else "done",
            "portal_ids": [e.portal_id for e in latest],
            "event_ids": [e.event_id for e in latest],
            "object_ids": [e.object_id for e in latest],
            "occurred_ats": [e.occurred_at for e in latest],
            "fields": [json.dumps(lead.fields) for lead in leads],
        }
        router = self.routers[cfg.org]

        def store() -> tuple[int, list[Outcome]]:
            with self.engine.begin() as conn:
                new = len(conn.execute(_INBOX_SQL["insert_events"], params).all())
                outcomes = (
                    [] if worker is not None else router.assign_in(conn, leads, "hubspot_webhook")
                )
            return new, outcomes

        new, outcomes = await self._in_db(store)
        event_ids = [e.event_id for e in latest]
        if worker is not None:
            worker.wake()
            self.metrics.webhook_events.labels(cfg.org, "queued").inc(new)
            self.metrics.webhook_events.labels(cfg.org, "duplicate").inc(len(latest) - new)
            log.info("hubspot org %s: events %s queued (%d new)", cfg.org, event_ids, new)
            return JSONResponse({"events": len(events), "routed": 0, "queued": new})
        _count_outcomes(self.metrics, cfg.org, "hubspot_webhook", outcomes)
        self.metrics.webhook_events.labels(cfg.org, "routed").inc(len(latest))
        log.info(
            "hubspot org %s: events %s -> leads %s",
            cfg.org,
            event_ids,
            [f"{o.crm_id}:{o.status}" for o in outcomes],
        )
        return JSONResponse(
            {
                "events": len(events),
                "routed": len(outcomes),
                "queued": 0,
                "assigned": sum(o.status == "assigned" for o in outcomes),
                "duplicates": sum(o.status == "duplicate" for o in outcomes),
            }
        )

    # -- health and metrics ----------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        def ping() -> None:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))

        try:
            await run_in_threadpool(ping)
        except Exception as exc:
            log.warning("healthz: database check failed: %s", type(exc).__name__)
            return JSONResponse(
                {"status": "unavailable", "error": "database_unavailable"},
                503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        return JSONResponse({"status": "ok"})

    async def metrics_endpoint(self, request: Request) -> Response:
        body = await run_in_threadpool(self.metrics.render)
        return Response(body, 200, media_type=CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.worker is not None:
            self.worker.start()
        try:
            yield
        finally:
            if self.worker is not None:
                await run_in_threadpool(self.worker.stop)


def _headers(exc: ApiError) -> dict[str, str]:
    return {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}


def _json_error(exc: ApiError) -> Response:
    return JSONResponse(
        {"error": exc.code, "message": exc.message}, exc.status, headers=_headers(exc)
    )


def _soap_error(exc: ApiError) -> Response:
    faultcode = "Client" if exc.status < 500 else "Server"
    return Response(
        soap_fault(f"{exc.code}: {exc.message}", faultcode),
        exc.status,
        media_type=SOAP_CONTENT_TYPE,
        headers=_headers(exc),
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    code = codes.get(exc.status_code, "bad_request")
    headers = dict(exc.headers or {})
    return JSONResponse(
        {"error": code, "message": str(exc.detail)}, exc.status_code, headers=headers
    )


def create_app(
    engine: Engine,
    configs: Mapping[str, OrgConfig],
    *,
    fetcher: Fetcher | None = None,
    clock: Callable[[], float] = time.time,
    public_base_url: str | None = None,
    inbox_lease_seconds: float = 120.0,
) -> Starlette:
    """The ASGI app: POST /webhooks/salesforce/{org}, POST /webhooks/hubspot/{org},
    GET /healthz, GET /metrics. ``configs`` maps org name to its config (teams applied);
    ``public_base_url`` is the scheme://host HubSpot calls when a proxy sits in front;
    ``inbox_lease_seconds`` is how long a dead inbox worker's claim blocks its events."""
    state = _App(engine, configs, fetcher, clock, public_base_url, inbox_lease_seconds)
    app = Starlette(
        routes=[
            Route("/webhooks/salesforce/{org}", state.salesforce, methods=["POST"]),
            Route("/webhooks/hubspot/{org}", state.hubspot, methods=["POST"]),
            Route("/healthz", state.healthz, methods=["GET"]),
            Route("/metrics", state.metrics_endpoint, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=state.lifespan,
    )
    app.state.connector = state
    app.state.metrics = state.metrics
    app.state.inbox_worker = state.worker
    return app


def app_from_env() -> Starlette:
    """Factory for ``uvicorn --factory``: configs from $CONNECTOR_CONFIG, the database from
    $DATABASE_URL (or the embedded one), migrated and with the teams applied."""
    from connector.cli import open_database
    from connector.config import config_path_from, load_configs

    configs = load_configs(config_path_from(None))
    engine = open_database(list(configs.values()))
    return create_app(
        engine, configs, public_base_url=os.environ.get("CONNECTOR_PUBLIC_BASE_URL") or None
    )
