"""HubSpot adapter on hubspot-api-client: batch owner updates, windowed search, owners API."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import urllib3
from hubspot import HubSpot
from urllib3.util.retry import Retry

from crm_adapters.base import (
    CrmAccount,
    CrmError,
    CrmRecord,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
    WriteOutcome,
)
from crm_adapters.batching import HUBSPOT_BATCH_MAX
from crm_adapters.fields import HUBSPOT_OWNER_PROPERTY
from crm_adapters.hubspot_errors import (
    API_EXCEPTIONS,
    classify_hubspot_exception,
    classify_hubspot_record_error,
    header_value,
    seconds_or_none,
)
from crm_adapters.hubspot_limits import (
    refusal_hold,
    refused_limiters,
    shared_limiter,
    window_budget,
)
from crm_adapters.ratelimit import RollingWindowLimiter

__all__ = ["HubSpotAdapter", "HubSpotSettings"]

log = logging.getLogger(__name__)

OWNER_PROPERTY = HUBSPOT_OWNER_PROPERTY
COMPANY_MODIFIED = "hs_lastmodifieddate"
COMPANY_DOMAIN_PROPERTIES = ("domain", "website")
_INVALID_OWNER_RE = re.compile(r"(\d+) is not a valid owner id")
_WINDOW_PAD = 1.05


@dataclass(frozen=True)
class HubSpotSettings:
    """One HubSpot account (private app token)."""

    access_token: str = field(repr=False)
    base_url: str = "https://api.hubapi.com"
    object: Literal["contacts", "leads"] = "contacts"
    limit_per_10s: int = 100
    search_per_s: float = 4.0
    timeout: float = 30.0
    # Read by changed_since (the poll); fetch_records reads only what it is asked for.
    extra_properties: tuple[str, ...] = ()
    search_result_cap: int = 10_000
    pool_size: int = 16
    # Called before each call of the account's general budget, after this process's own
    # limiter: blocks until the budget shared with other processes allows it (the connector
    # passes connector/core/budget.py SharedBudget.acquire).
    shared_budget: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    @property
    def modified_property(self) -> str:
        """Contacts keep the legacy `lastmodifieddate`; other objects use `hs_lastmodifieddate`."""
        return "lastmodifieddate" if self.object == "contacts" else "hs_lastmodifieddate"


def _to_ms(dt: datetime) -> int:
    aware = dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    return int(aware.timestamp() * 1000)


def _parse_hs_time(value: object) -> datetime:
    """HubSpot times come as ISO strings ('...Z') or epoch milliseconds."""
    s = str(value)
    if s.isdigit():
        return datetime.fromtimestamp(int(s) / 1000, tz=UTC)
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


class HubSpotAdapter:
    """CrmAdapter for one HubSpot account (contacts or leads owner writes)."""

    kind = "hubspot"
    max_batch = HUBSPOT_BATCH_MAX
    owner_field = OWNER_PROPERTY

    def __init__(self, settings: HubSpotSettings) -> None:
        self.settings = settings
        client = HubSpot(
            access_token=settings.access_token,
            host=settings.base_url.rstrip("/"),
            retry=Retry(total=0, redirect=0, raise_on_status=False),
            connection_pool_maxsize=settings.pool_size,
        )
        self._batch = client.crm.objects.batch_api
        self._search = client.crm.objects.search_api
        self._owners = client.crm.owners.owners_api
        # Windows are padded a little: the server counts arrival times, we count send times.
        self._limiter: RollingWindowLimiter = shared_limiter(
            settings.base_url,
            settings.access_token,
            "general",
            settings.limit_per_10s,
            10.0 * _WINDOW_PAD + 0.05,
        )
        sps = settings.search_per_s
        s_limit, s_window = (max(1, round(sps)), 1.0) if sps >= 1 else (1, 1.0 / max(sps, 1e-3))
        self._search_limiter: RollingWindowLimiter = shared_limiter(
            settings.base_url,
            settings.access_token,
            "search",
            s_limit,
            s_window * _WINDOW_PAD + 0.05,
        )
        self._usage_lock = threading.Lock()
        self._rate_headers: dict[str, str] = {}
        self._calls = 0

    # ----------------------------------------------------------------- transport
    def _remember(
        self,
        headers: Mapping[str, str] | None,
        search: bool = False,
        learn: bool = True,
        sent_at: float | None = None,
    ) -> None:
        """Keep the last rate-limit headers for `usage`, and let the general limiter learn the
        account's real budget from them (search answers carry none)."""
        if not headers:
            return
        found = {
            k.lower(): str(v)
            for k, v in headers.items()
            if k.lower().startswith("x-hubspot-ratelimit")
        }
        with self._usage_lock:
            self._calls += 1
            if found:
                self._rate_headers = found
        budget = window_budget(found) if learn and not search else None
        if budget is not None:
            self._limiter.observe(*budget, sent_at=sent_at)

    def _call(self, fn: Callable[..., Any], *args: Any, search: bool = False, **kw: Any) -> Any:
        """Call a generated API method under the client-side budget; return the parsed JSON."""
        (self._search_limiter if search else self._limiter).acquire()
        if not search and self.settings.shared_budget is not None:
            self.settings.shared_budget()
        sent_at = time.monotonic()
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.settings.timeout, **kw)
        except API_EXCEPTIONS as exc:
            headers = dict(exc.headers) if exc.headers else None
            err = classify_hubspot_exception(exc)
            if not (isinstance(err, RateLimitedError) and err.scope == "request"):
                self._remember(headers, search=search, sent_at=sent_at)
                raise err from exc
            # Refused: every call on this account waits here instead of being refused again
            # (HubSpot counts repeated 429s against an app). A refusal's counts are not
            # learned from: its Retry-After, or else a whole window, decides the wait.
            self._remember(headers, search=search, learn=False)
            which = refused_limiters(err.code, search)
            limiters = [self._search_limiter if w == "search" else self._limiter for w in which]
            # the refused budget's window (the general one's when every call waits), and at
            # most one window of the general limiter: a write waiting here must still end
            # within its claim's lease (connector/writeback/dispatch.py `_keep_lease`)
            told = seconds_or_none(header_value(headers, "Retry-After"))
            window = max(limiter.window for limiter in limiters)
            held = min(refusal_hold(err.code, told, window), self._limiter.window)
            for limiter in limiters:
                limiter.hold(held)
            # the records are retried once the hold is over, not claimed to wait in it
            raise RateLimitedError(err.code, err.message, held, scope="request") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify_hubspot_exception(exc) from exc
        try:
            raw = resp.data
            self._remember(dict(resp.headers), search=search, sent_at=sent_at)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify_hubspot_exception(exc) from exc
        finally:
            resp.release_conn()
        try:
            return json.loads(raw) if raw else {}
        except ValueError as exc:
            raise RetryableError("bad_response", "response is not JSON") from exc

    # ----------------------------------------------------------------- writes
    def write_owners(self, batch: Sequence[OwnerWrite]) -> list[WriteOutcome]:
        """Batch update `hubspot_owner_id`; 207 partial errors mapped per record, in order."""
        if not batch:
            return []
        if len(batch) > self.max_batch:
            raise ValueError(f"batch of {len(batch)} exceeds {self.max_batch}")
        results: dict[int, WriteOutcome] = {}
        self._write(list(enumerate(batch)), results)
        return [results[i] for i in range(len(batch))]

    def _write(self, items: list[tuple[int, OwnerWrite]], out: dict[int, WriteOutcome]) -> None:
        body = {
            "inputs": [
                {"id": w.record_id, "properties": {OWNER_PROPERTY: w.owner_id}} for _, w in items
            ]
        }
        try:
            data = self._call(self._batch.update, self.settings.object, body)
        except PermanentError as err:
            if err.code != "VALIDATION_ERROR":
                raise
            # A whole-batch validation failure: blame the named bad owners, or bisect.
            bad = set(_INVALID_OWNER_RE.findall(err.message))
            blamed = [(i, w) for i, w in items if w.owner_id in bad]
            rest = [(i, w) for i, w in items if w.owner_id not in bad]
            for i, w in blamed:
                log.info(
                    "hubspot write failed record=%s code=INVALID_OWNER_ID",
                    w.record_id,
                    extra={"crm_id": w.record_id, "code": "INVALID_OWNER_ID"},
                )
                out[i] = WriteOutcome(w.key, False, PermanentError("INVALID_OWNER_ID", err.message))
            if blamed:
                if rest:
                    self._write(rest, out)
                return
            if len(items) == 1:
                i, w = items[0]
                log.info(
                    "hubspot write failed record=%s code=%s",
                    w.record_id,
                    err.code,
                    extra={"crm_id": w.record_id, "code": err.code},
                )
                out[i] = WriteOutcome(w.key, False, err)
                return
            mid = len(items) // 2
            self._write(items[:mid], out)
            self._write(items[mid:], out)
            return
        ok_ids = {str(r.get("id")) for r in data.get("results", []) if isinstance(r, dict)}
        errors: dict[str, CrmError] = {}
        for e in data.get("errors", []) or []:
            if not isinstance(e, dict):
                continue
            rec_err = classify_hubspot_record_error(
                str(e.get("category", "")), str(e.get("message", ""))
            )
            for rid in (e.get("context") or {}).get("ids") or []:
                errors[str(rid)] = rec_err
        refused = [err for err in errors.values() if isinstance(err, RateLimitedError)]
        if refused:
            # records refused for rate limits: every call on the account but searches (their
            # own budget) waits as after a refused call, so their retry is not refused again
            # (no policy is named here)
            self._limiter.hold(max(err.retry_after or 1.0 for err in refused))
        for i, w in items:
            if w.record_id in errors:
                code = errors[w.record_id].code
                log.info(
                    "hubspot write failed record=%s code=%s",
                    w.record_id,
                    code,
                    extra={"crm_id": w.record_id, "code": code},
                )
                out[i] = WriteOutcome(w.key, False, errors[w.record_id])
            elif w.record_id in ok_ids:
                out[i] = WriteOutcome(w.key, True)
            else:
                out[i] = WriteOutcome(
                    w.key, False, RetryableError("MISSING_RESULT", "no result for record")
                )

    # ----------------------------------------------------------------- reads
    def _properties(self, extra: Sequence[str], configured: bool = True) -> list[str]:
        props = [OWNER_PROPERTY, self.settings.modified_property]
        if configured:
            props.extend(self.settings.extra_properties)
        props.extend(extra)
        return list(dict.fromkeys(props))

    def _to_record(self, obj: Mapping[str, Any]) -> CrmRecord:
        props = dict(obj.get("properties") or {})
        modified = props.get(self.settings.modified_property) or obj.get("updatedAt")
        fields = {
            str(k): (None if v is None else str(v))
            for k, v in props.items()
            if k not in (self.settings.modified_property, "hs_object_id")
        }
        return CrmRecord(str(obj["id"]), fields, _parse_hs_time(modified))

    def changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmRecord]]:
        """Search lastmodifieddate >= since (< until) ascending; re-window before the cap."""
        for objs in self._search_changed(
            self.settings.object,
            self.settings.modified_property,
            self._properties(()),
            since,
            until,
            page_size,
        ):
            yield [self._to_record(o) for o in objs]

    def accounts_changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmAccount]]:
        """Companies by hs_lastmodifieddate, with owner, domain and website (the mirror)."""
        props = ["hs_object_id", OWNER_PROPERTY, COMPANY_MODIFIED, *COMPANY_DOMAIN_PROPERTIES]
        for objs in self._search_changed(
            "companies", COMPANY_MODIFIED, props, since, until, page_size
        ):
            page: list[CrmAccount] = []
            for o in objs:
                p = dict(o.get("properties") or {})
                owner = p.get(OWNER_PROPERTY)
                page.append(
                    CrmAccount(
                        crm_id=str(o["id"]),
                        owner_id=str(owner) if owner not in (None, "") else None,
                        domain_values=tuple(
                            None if p.get(k) is None else str(p.get(k))
                            for k in COMPANY_DOMAIN_PROPERTIES
                        ),
                        modified_at=_parse_hs_time(p.get(COMPANY_MODIFIED) or o.get("updatedAt")),
                    )
                )
            yield page

    def _search_changed(
        self,
        object_type: str,
        prop: str,
        properties: list[str],
        since: datetime,
        until: datetime | None,
        page_size: int,
    ) -> Iterator[list[Mapping[str, Any]]]:
        """Pages of raw search results with prop >= since (< until), ascending; the window
        moves forward before the search's result cap instead of paging deeper."""
        limit = max(1, min(page_size, 200))
        cap = self.settings.search_result_cap
        window_lo = _to_ms(since)
        hi = _to_ms(until) if until is not None else None
        after: str | None = None
        last_ms = -1
        ids_at_last: set[str] = set()
        skip_at_lo: set[str] = set()
        while True:
            filters: list[dict[str, str]] = [
                {"propertyName": prop, "operator": "GTE", "value": str(window_lo)}
            ]
            if hi is not None:
                filters.append({"propertyName": prop, "operator": "LT", "value": str(hi)})
            body: dict[str, Any] = {
                "filterGroups": [{"filters": filters}],
                "sorts": [{"propertyName": prop, "direction": "ASCENDING"}],
                "properties": properties,
                "limit": limit,
            }
            if after is not None:
                body["after"] = after
            data = self._call(self._search.do_search, object_type, body, search=True)
            page: list[Mapping[str, Any]] = []
            for obj in data.get("results", []) or []:
                props = obj.get("properties") or {}
                rid = str(obj["id"])
                ms = _to_ms(_parse_hs_time(props.get(prop) or obj.get("updatedAt")))
                if ms == window_lo and rid in skip_at_lo:
                    continue
                if ms > last_ms:
                    last_ms, ids_at_last = ms, {rid}
                elif ms == last_ms:
                    ids_at_last.add(rid)
                page.append(obj)
            if page:
                yield page
            nxt = ((data.get("paging") or {}).get("next") or {}).get("after")
            if not nxt or not data.get("results"):
                return
            if str(nxt).isdigit() and int(nxt) + limit > cap:
                if last_ms <= window_lo:
                    log.warning("hubspot search: more than %d records share one ms; skipping", cap)
                    window_lo, skip_at_lo = window_lo + 1, set()
                else:
                    window_lo, skip_at_lo = last_ms, set(ids_at_last)
                after = None
            else:
                after = str(nxt)

    def fetch_records(self, ids: Sequence[str], fields: Sequence[str]) -> list[CrmRecord]:
        """Batch read (100 per call) of the requested properties plus the owner; missing ids
        are skipped."""
        unique = list(dict.fromkeys(ids))
        found: dict[str, CrmRecord] = {}
        for i in range(0, len(unique), HUBSPOT_BATCH_MAX):
            body = {
                "properties": self._properties(fields, configured=False),
                "inputs": [{"id": x} for x in unique[i : i + HUBSPOT_BATCH_MAX]],
                "propertiesWithHistory": [],
            }
            data = self._call(self._batch.read, self.settings.object, body)
            for obj in data.get("results", []) or []:
                rec = self._to_record(obj)
                found[rec.crm_id] = rec
        return [found[i] for i in ids if i in found]

    def _owner_ids(self, archived: bool) -> set[str]:
        ids: set[str] = set()
        after: str | None = None
        while True:
            kw: dict[str, Any] = {"limit": 500, "archived": archived}
            if after:
                kw["after"] = after
            data = self._call(self._owners.get_page, **kw)
            ids.update(str(o.get("id")) for o in data.get("results", []) or [])
            after = ((data.get("paging") or {}).get("next") or {}).get("after")
            if not after:
                return ids

    def check_owners(self, owner_ids: Sequence[str]) -> dict[str, str | None]:
        """Owners API: None = active owner, 'archived' or 'not found' otherwise."""
        if not owner_ids:
            return {}
        active = self._owner_ids(False)
        result: dict[str, str | None] = {o: None if o in active else "not found" for o in owner_ids}
        if any(v is not None for v in result.values()):
            archived = self._owner_ids(True)
            for o in owner_ids:
                if result[o] is not None and o in archived:
                    result[o] = "archived"
        return result

    def usage(self) -> dict[str, object]:
        """Client-side budget use plus the last X-HubSpot-RateLimit-* headers seen."""
        with self._usage_lock:
            headers = dict(self._rate_headers)
            calls = self._calls
        return {
            "kind": self.kind,
            "calls": calls,
            "limit_per_10s": self.settings.limit_per_10s,
            # the configured limit, lowered to what the account's headers say it really is
            "effective_limit_per_10s": self._limiter.limit,
            "used_in_window": self._limiter.in_window(),
            "held_s": round(self._limiter.held_for(), 3),
            "search_held_s": round(self._search_limiter.held_for(), 3),
            "client_waited_s": round(self._limiter.waited_s, 3),
            "rate_limit_headers": headers,
        }
