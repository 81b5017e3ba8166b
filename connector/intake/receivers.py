"""HTTP receivers for CRM pushes (Salesforce Outbound Messages, HubSpot v3 webhooks), and the
admin listener (health and metrics).

Every push is a hint. A receiver authenticates the sender, checks the body, commits the record
ids to the intake inbox in one short transaction and answers; the ``InboxWorker`` (started by
the app's lifespan when it is given the CRM adapters) reads each record back from the CRM and
routes it only if the CRM says it is unrouted (see ``connector.intake.inbox`` and
``connector.intake.verify``). An acknowledged delivery is never lost and a refused one stored
nothing (the CRM retries it). Bad input gets a precise 4xx with a stable error code (JSON, or a SOAP
fault on the Salesforce endpoint); a database outage gets a 503 with Retry-After. Logs carry
event, notification and record ids only (truncated), never field values, tokens or bodies.

Senders:
- Salesforce: the endpoint URL ends with one of the org's ``crm.outbound_secrets``; the
  OrganizationId must match; optionally the sender's address must be in
  ``crm.outbound_allow_cidrs``. An unknown org, a missing or wrong secret and a refused
  address all get the same 404, so org names cannot be enumerated.
- HubSpot: a v3 signature with one of ``crm.webhook_secrets``; events of any portal other than
  ``crm.portal_id`` are refused and nothing of them is stored. The org, the signature and
  timestamp headers are checked before the body is read, the body is read under a
  process-wide budget of bytes held for senders not yet authenticated (503 past it), and an
  unknown org, a missing or stale header and a wrong signature all get the same 404.

Refusals are logged with their reason, at most one line per reason per 10 s with a count of
the rest (``connector.core.throttled_log``).

The public listener serves only the webhook paths; ``/healthz`` and ``/metrics`` are on the
admin app (``connector.shell.admin``), which ``connector run`` binds to localhost by default.

Run it: ``uvicorn --factory connector.shell.service:app_from_env`` with ``CONNECTOR_CONFIG`` (and
``DATABASE_URL``) set; behind a TLS-terminating proxy also set ``CONNECTOR_PUBLIC_BASE_URL``
(e.g. ``https://hooks.example.com``), the base of the URL HubSpot signs, and
``CONNECTOR_TRUSTED_PROXIES`` (the proxies' CIDRs) when the Salesforce address allowlist is used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from connector.core import outage
from connector.core.config import ConfigError, HubSpotCrm, OrgConfig, SalesforceCrm
from connector.core.database import AsyncPool, async_pool_for
from connector.core.errors import Conflict, DatabaseError, DatabaseUnavailable
from connector.core.leases import DEFAULT_LEASE_S
from connector.core.metrics import Metrics
from connector.core.throttled_log import ThrottledLog
from connector.intake.http_server import (
    DEFAULT_BODY_TIMEOUT,
    BodyError,
    ByteBudget,
    Holding,
    read_body,
)
from connector.intake.hubspot_events import (
    HUBSPOT_OBJECT_TYPE_IDS,
    EventError,
    dedupe_latest,
    lead_events,
    parse_events,
)
from connector.intake.inbox import AdapterSource, EventWriter, InboxWorker
from connector.intake.parsing import ParserUnavailable, close_parsers, parse_body
from connector.intake.senders import (
    IPNetwork,
    client_address,
    in_networks,
    parse_networks,
    printable_id,
    secret_matches,
)
from connector.intake.signatures import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    check_v3_headers,
    verify_v3,
)
from connector.intake.soap import SoapError, ack_response, parse_outbound_message, soap_fault
from connector.routing.assign import Router, RoutingError
from crm_adapters.salesforce_ids import id_key, is_id, same_id

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_AFTER_SECONDS = 5
SOAP_CONTENT_TYPE = "text/xml; charset=utf-8"
BODY_TIMEOUT_SECONDS = DEFAULT_BODY_TIMEOUT
STORE_POOL_SIZE = 8
"""Database connections the receivers' inserts may use at once (one statement each)."""
DEFAULT_UNAUTHENTICATED_BYTES = 32 * 1_048_576
"""Bytes of bodies not yet authenticated the process holds at once: 32 bodies at the 1 MiB
cap, thousands of real HubSpot deliveries (a few KiB each)."""


class ApiError(Exception):
    """A refused request: HTTP status, a stable code, and a message safe to send and log."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retry_after: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.headers = dict(headers or {})


# One answer for every request that is not from a known, authenticated sender.
NOT_FOUND = ApiError(404, "not_found", "Not Found")
# The same for HubSpot, where it may come before the body was read: the connection is closed
# rather than drained, for every refusal alike, so the answers are the same bytes.
NOT_FOUND_CLOSE = ApiError(404, "not_found", "Not Found", headers={"Connection": "close"})
_refusals = ThrottledLog(log)


# --- request helpers ------------------------------------------------------------------------


async def read_capped(request: Request, limit: int, holding: Holding | None = None) -> bytes:
    """The body under the size cap and the body timeout (see connector.intake.http_server),
    its bytes taken from ``holding``'s budget as they arrive."""
    try:
        return await read_body(request, limit, BODY_TIMEOUT_SECONDS, holding)
    except BodyError as exc:
        retry = RETRY_AFTER_SECONDS if exc.status == 503 else None
        raise ApiError(exc.status, exc.code, exc.message, retry, headers=exc.headers) from None


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


def db_errors(exc: Exception) -> ApiError | None:
    """Translate a database or routing-state failure into the answer to give, if it is one.

    An outage and a lost race (the sender's retry will succeed) both ask for a retry.
    """
    if isinstance(exc, DatabaseUnavailable | Conflict):
        return ApiError(
            503, "database_unavailable", "the database is unavailable", RETRY_AFTER_SECONDS
        )
    if isinstance(exc, RoutingError):
        return ApiError(
            503, "routing_not_ready", "routing state is not applied", RETRY_AFTER_SECONDS
        )
    if isinstance(exc, DatabaseError):
        return ApiError(500, "database_error", "the database refused the transaction")
    return None


# --- the app ----------------------------------------------------------------------------


class _App:
    def __init__(
        self,
        engine: Engine,
        configs: Mapping[str, OrgConfig],
        adapters: AdapterSource | None,
        clock: Callable[[], float],
        public_base_url: str | None,
        inbox_lease_seconds: float,
        trusted_proxies: Sequence[IPNetwork],
        metrics: Metrics | None,
        store_pool: AsyncPool | None,
        unauthenticated_bytes: int,
    ) -> None:
        self.engine = engine
        self.unauthenticated = ByteBudget(unauthenticated_bytes)
        self.store_pool = store_pool or async_pool_for(engine, max_size=STORE_POOL_SIZE)
        self.writer = EventWriter(self.store_pool, max_in_flight=STORE_POOL_SIZE // 2)
        self.configs = dict(configs)
        self.clock = clock
        self.public_base_url = public_base_url
        self.trusted_proxies = list(trusted_proxies)
        self.metrics = metrics or Metrics(engine, self.configs)
        self.routers = {
            org: Router(engine, cfg, unparsed=self.metrics.unparsed(org))
            for org, cfg in self.configs.items()
        }
        self.allow = {
            org: parse_networks(cfg.crm.outbound_allow_cidrs)
            for org, cfg in self.configs.items()
            if isinstance(cfg.crm, SalesforceCrm)
        }
        self.worker = (
            InboxWorker(
                engine,
                self.configs,
                self.routers,
                adapters,
                self.metrics,
                lease_seconds=inbox_lease_seconds,
            )
            if adapters is not None
            else None
        )

    # -- shared ----------------------------------------------------------------------------

    def _observe(self, endpoint: str, started: float, status: int) -> None:
        self.metrics.webhook_requests.labels(endpoint, str(status)).inc()
        self.metrics.webhook_latency.labels(endpoint).observe(time.perf_counter() - started)

    async def _store(self, cfg: OrgConfig, keys: list[str], ids: list[str]) -> int:
        """Store a delivery's events (committed with those of the deliveries that arrived
        meanwhile, see ``EventWriter``); the number that were new."""
        try:
            return await self.writer.store(cfg, keys, ids)
        except Exception as exc:
            mapped = db_errors(exc)
            if mapped is None:
                raise
            if not outage.counted("webhook deliveries", exc):
                # a DatabaseError's message holds SQLSTATE and names, never values
                log.error("%s", exc if isinstance(exc, DatabaseError) else type(exc).__name__)
            raise mapped from None

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

    def _refuse(
        self, kind: str, org: str, reason: str, why: str, answer: ApiError = NOT_FOUND
    ) -> ApiError:
        """Log a refused sender (throttled per reason) and return the one answer for all."""
        _refusals(
            f"{kind}:{reason}",
            "%s webhook refused for org %s: %s",
            kind,
            printable_id(org, 64),
            why,
        )
        return answer

    # -- Salesforce ------------------------------------------------------------------------

    async def salesforce(self, request: Request) -> Response:
        return await self._answer("salesforce", self._salesforce, _soap_error, request)

    def _salesforce_sender(self, request: Request) -> OrgConfig:
        """The org whose URL secret (and address allowlist) this request passes, else 404."""
        org = request.path_params["org"]
        given = request.path_params.get("secret", "")
        cfg = self.configs.get(org)
        crm = cfg.crm if cfg is not None else None
        if cfg is None or not isinstance(crm, SalesforceCrm):
            secret_matches(given, ["-" * 32])  # same work as a real check
            raise self._refuse("salesforce", org, "no_org", "no such Salesforce org")
        secrets = [s.get_secret_value() for s in crm.outbound_secrets if s.get_secret_value()]
        if not secrets:
            secret_matches(given, ["-" * 32])  # same work as a real check
            raise self._refuse(
                "salesforce", org, "not_configured", "crm.outbound_secrets is not configured"
            )
        if not secret_matches(given, secrets):
            raise self._refuse("salesforce", org, "secret", "missing or wrong URL secret")
        networks = self.allow.get(cfg.org) or []
        if networks:
            peer = request.client.host if request.client else None
            address = client_address(
                peer, request.headers.get("x-forwarded-for"), self.trusted_proxies
            )
            if not in_networks(address, networks):
                raise self._refuse(
                    "salesforce", org, "address", f"address {address} is not allowed"
                )
        return cfg

    async def _salesforce(self, request: Request) -> Response:
        cfg = self._salesforce_sender(request)
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
            message = await _parse(parse_outbound_message, body, limit)
        except SoapError as exc:
            raise ApiError(exc.http_status, exc.code, exc.message) from None
        if not same_id(message.organization_id, crm.organization_id):
            raise ApiError(403, "wrong_organization", "OrganizationId does not match this org")
        keys: list[str] = []
        ids: list[str] = []
        for i, n in enumerate(message.notifications):
            if n.sobject_type != crm.object:
                raise ApiError(
                    400,
                    "wrong_sobject_type",
                    f"Notification {i}: sObject is {n.sobject_type}, expected {crm.object}",
                )
            if not is_id(n.sobject_id):
                raise ApiError(400, "invalid_lead", f"Notification {i}: not a Salesforce id")
            record_id = id_key(n.sobject_id)
            # A redelivery repeats both; a notification id reused for another record (a buggy
            # or hostile sender) cannot hide that record.
            keys.append(f"{n.notification_id}:{record_id}")
            ids.append(record_id)

        new = await self._store(cfg, keys, ids)
        # Committed: only now may Salesforce stop retrying.
        if self.worker is not None:
            self.worker.wake()
        self.metrics.webhook_events.labels(cfg.org, "queued").inc(new)
        self.metrics.webhook_events.labels(cfg.org, "duplicate").inc(len(keys) - new)
        log.info(
            "salesforce org %s: %d notifications (first %s) stored, %d new",
            cfg.org,
            len(keys),
            printable_id(keys[0]) if keys else "-",
            new,
            extra={"org": cfg.org, "event_ids": [printable_id(k, 64) for k in keys]},
        )
        return Response(ack_response(), 200, media_type=SOAP_CONTENT_TYPE)

    # -- HubSpot ---------------------------------------------------------------------------

    async def hubspot(self, request: Request) -> Response:
        return await self._answer("hubspot", self._hubspot, _json_error, request)

    def _hubspot_refused(self, org: str, reason: str, why: str) -> ApiError:
        return self._refuse("hubspot", org, reason, why, NOT_FOUND_CLOSE)

    async def _hubspot(self, request: Request) -> Response:
        org = request.path_params["org"]
        cfg = self.configs.get(org)
        crm = cfg.crm if cfg is not None else None
        if cfg is None or not isinstance(crm, HubSpotCrm):
            raise self._hubspot_refused(org, "no_org", "no such HubSpot org")
        secrets = [s.get_secret_value() for s in crm.webhook_secrets if s.get_secret_value()]
        if not secrets or crm.portal_id is None:
            raise self._hubspot_refused(
                org, "not_configured", "crm.webhook_secrets is not configured"
            )
        signature = request.headers.get(SIGNATURE_HEADER)
        timestamp = request.headers.get(TIMESTAMP_HEADER)
        now_ms = int(self.clock() * 1000)
        try:
            # everything that needs no body, before a byte of it is read
            check_v3_headers(signature, timestamp, now_ms)
        except SignatureError as exc:
            raise self._hubspot_refused(org, exc.code, exc.message) from None
        limit = cfg.webhook.max_body_bytes
        with self.unauthenticated.hold() as holding:
            body = await read_capped(request, limit, holding)
            try:
                verify_v3(
                    secrets,
                    request.method,
                    signed_uri(request, self.public_base_url),
                    body,
                    signature,
                    timestamp,
                    now_ms,
                )
            except SignatureError as exc:
                raise self._hubspot_refused(org, exc.code, exc.message) from None
        try:
            events = await _parse(parse_events, body, limit)
        except EventError as exc:
            raise ApiError(exc.http_status, exc.code, exc.message) from None
        own = [e for e in events if e.portal_id == crm.portal_id]
        foreign = len(events) - len(own)
        if foreign:
            self.metrics.webhook_events.labels(cfg.org, "foreign_portal").inc(foreign)
            log.warning("hubspot org %s: %d events of other portals refused", cfg.org, foreign)
            if not own:
                raise ApiError(403, "wrong_portal", "no event belongs to this org's HubSpot portal")
        kept = lead_events(
            own,
            routed_properties=crm.routed_properties,
            object_type_ids={HUBSPOT_OBJECT_TYPE_IDS[crm.object]},
        )
        latest = dedupe_latest(kept)
        ignored = len(own) - len(kept)
        self.metrics.webhook_events.labels(cfg.org, "ignored").inc(ignored)
        if not latest:
            return JSONResponse(
                {"events": len(events), "queued": 0, "duplicates": 0, "foreign": foreign}
            )
        keys = [f"{e.portal_id}:{e.event_id}:{e.object_id}" for e in latest]
        ids = [str(e.object_id) for e in latest]

        new = await self._store(cfg, keys, ids)
        if self.worker is not None:
            self.worker.wake()
        self.metrics.webhook_events.labels(cfg.org, "queued").inc(new)
        self.metrics.webhook_events.labels(cfg.org, "duplicate").inc(len(latest) - new)
        log.info(
            "hubspot org %s: %d events (first %s) stored, %d new",
            cfg.org,
            len(latest),
            latest[0].event_id,
            new,
            extra={"org": cfg.org, "event_ids": [e.event_id for e in latest]},
        )
        return JSONResponse(
            {
                "events": len(events),
                "queued": new,
                "duplicates": len(latest) - new,
                "foreign": foreign,
            }
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if self.worker is not None:
            self.worker.start()
        try:
            yield
        finally:
            await self.store_pool.close()
            close_parsers()
            if self.worker is not None:
                await run_in_threadpool(self.worker.stop)


async def _parse(parse: Callable[[bytes, int], T], body: bytes, limit: int) -> T:
    """``parse(body, limit)`` where it costs the other requests least
    (``connector.intake.parsing``); a parser process that died is a 503 (the sender retries)."""
    try:
        return await parse_body(parse, body, limit)
    except ParserUnavailable:
        log.error("the body parser process stopped; starting another for the next body")
        raise ApiError(
            503, "parser_unavailable", "the body parser restarted", RETRY_AFTER_SECONDS
        ) from None


def _headers(exc: ApiError) -> dict[str, str]:
    retry = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}
    return {**exc.headers, **retry}


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
    adapters: AdapterSource | None = None,
    clock: Callable[[], float] = time.time,
    public_base_url: str | None = None,
    inbox_lease_seconds: float = DEFAULT_LEASE_S,
    trusted_proxies: Sequence[IPNetwork] = (),
    metrics: Metrics | None = None,
    store_pool: AsyncPool | None = None,
    unauthenticated_bytes: int = DEFAULT_UNAUTHENTICATED_BYTES,
) -> Starlette:
    """The public ASGI app: POST /webhooks/salesforce/{org}/{secret} and
    POST /webhooks/hubspot/{org}, nothing else.

    ``configs`` maps org name to its config (teams applied). With ``adapters`` (org name ->
    CRM adapter) the app runs the inbox worker that reads pushed records back from the CRM and
    routes them; without, events wait in the inbox for a process that has one.
    ``public_base_url`` is the scheme://host HubSpot calls when a proxy sits in front;
    ``trusted_proxies`` are the proxies whose X-Forwarded-For is believed for the Salesforce
    address allowlist; ``inbox_lease_seconds`` is how long a dead worker's claim blocks its
    events. ``app.state.metrics`` is the registry to serve on the admin listener.
    ``store_pool`` is where the events are inserted (default: a pool of ``STORE_POOL_SIZE``
    asyncio connections to ``engine``'s database, closed by the app's lifespan).
    ``unauthenticated_bytes`` is the budget of body bytes held for senders not yet
    authenticated (a HubSpot body before its signature is checked); past it, 503.
    """
    state = _App(
        engine,
        configs,
        adapters,
        clock,
        public_base_url,
        inbox_lease_seconds,
        trusted_proxies,
        metrics,
        store_pool,
        unauthenticated_bytes,
    )
    app = Starlette(
        routes=[
            Route("/webhooks/salesforce/{org}", state.salesforce, methods=["POST"]),
            Route("/webhooks/salesforce/{org}/{secret}", state.salesforce, methods=["POST"]),
            Route("/webhooks/hubspot/{org}", state.hubspot, methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=state.lifespan,
    )
    app.state.connector = state
    app.state.metrics = state.metrics
    app.state.inbox_worker = state.worker
    return app


def trusted_proxies_from_env(env: Mapping[str, str] | None = None) -> list[IPNetwork]:
    """$CONNECTOR_TRUSTED_PROXIES: comma-separated CIDRs of proxies whose X-Forwarded-For is
    believed (nothing by default)."""
    raw = (os.environ if env is None else env).get("CONNECTOR_TRUSTED_PROXIES", "")
    return parse_networks(raw.split(","))


def unauthenticated_bytes_from_env(env: Mapping[str, str] | None = None) -> int:
    """$CONNECTOR_MAX_UNAUTHENTICATED_BYTES: body bytes held at once for senders not yet
    authenticated (default 32 MiB); ConfigError (one line) for anything but a whole number
    of at least 65,536."""
    name = "CONNECTOR_MAX_UNAUTHENTICATED_BYTES"
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return DEFAULT_UNAUTHENTICATED_BYTES
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 12) or int(raw) < 65_536:
        raise ConfigError(
            f"{name} must be a whole number of bytes, at least 65536, got {raw[:20]!r}"
        )
    return int(raw)
