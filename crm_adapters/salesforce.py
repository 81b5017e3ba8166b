"""Salesforce adapter on simple-salesforce: sObject Collections writes, SOQL reads."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter
from simple_salesforce.api import Salesforce
from simple_salesforce.exceptions import SalesforceError

from crm_adapters.base import (
    AuthError,
    CrmAccount,
    CrmError,
    CrmRecord,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
    WriteOutcome,
)
from crm_adapters.fields import SALESFORCE_OWNER_FIELD, salesforce_parent_field
from crm_adapters.salesforce_ids import id_key, is_id

__all__ = [
    "SalesforceAdapter",
    "SalesforceSettings",
    "classify_salesforce_exception",
    "classify_salesforce_http",
    "classify_salesforce_record_error",
    "parse_limit_info",
]

log = logging.getLogger(__name__)

_RETRYABLE_RECORD_CODES = frozenset(
    {
        "UNABLE_TO_LOCK_ROW",
        "SERVER_UNAVAILABLE",
        "UNKNOWN_EXCEPTION",
        "REQUEST_RUNNING_TOO_LONG",
        "QUERY_TIMEOUT",
        "ALL_OR_NONE_OPERATION_ROLLED_BACK",
    }
)
_ORG_LIMIT_CODES = frozenset({"REQUEST_LIMIT_EXCEEDED", "TXN_SECURITY_METERING_ERROR"})
_AUTH_CODES = frozenset({"INVALID_SESSION_ID", "INVALID_AUTH_HEADER", "API_DISABLED_FOR_ORG"})
_ORG_LIMIT_RETRY_S = 900.0
_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_IN_CHUNK = 200


def classify_salesforce_record_error(status_code: str, message: str = "") -> CrmError:
    """Map one per-record `statusCode` from a DML result to the error class that says what to do."""
    if status_code in _RETRYABLE_RECORD_CODES:
        return RetryableError(status_code, message)
    if status_code in _ORG_LIMIT_CODES:
        return RateLimitedError(status_code, message, _ORG_LIMIT_RETRY_S, scope="org")
    if status_code in _AUTH_CODES:
        return AuthError(status_code, message)
    if status_code == "CANNOT_INSERT_UPDATE_ACTIVATE_ENTITY" and "UNABLE_TO_LOCK_ROW" in message:
        return RetryableError("UNABLE_TO_LOCK_ROW", message)
    return PermanentError(status_code or "UNKNOWN", message)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return max(float(value), 0.0)
            except ValueError:
                return None
    return None


def _first_error(body: object) -> tuple[str, str]:
    """(errorCode, message) from a Salesforce REST error body, or ("", "")."""
    item: object = body[0] if isinstance(body, list) and body else body
    if isinstance(item, dict):
        code = item.get("errorCode") or item.get("statusCode") or item.get("error") or ""
        msg = item.get("message") or item.get("error_description") or ""
        return str(code), str(msg)
    return "", ""


def classify_salesforce_http(
    status: int, body: object = None, headers: Mapping[str, str] | None = None
) -> CrmError:
    """Map a failed whole-request HTTP response (status, parsed body, headers) to an error."""
    code, message = _first_error(body)
    hdrs = headers or {}
    retry_after = _retry_after(hdrs)
    label = code or str(status)
    if code in _ORG_LIMIT_CODES:
        return RateLimitedError(code, message, retry_after or _ORG_LIMIT_RETRY_S, scope="org")
    if code in _RETRYABLE_RECORD_CODES:
        return RetryableError(code, message, retry_after)
    if status == 401 or code in _AUTH_CODES:
        return AuthError(label, message)
    if status == 403:
        return AuthError(label, message)
    if status == 429:
        return RateLimitedError(label, message, retry_after or 1.0, scope="request")
    if status in (408, 420) or status >= 500:
        return RetryableError(label, message, retry_after)
    return PermanentError(label, message)


def classify_salesforce_exception(
    exc: BaseException, headers: Mapping[str, str] | None = None
) -> CrmError:
    """Translate simple-salesforce / requests exceptions into the CrmError hierarchy.

    simple-salesforce's errors carry no headers, so the caller passes the failed response's
    (for its Retry-After)."""
    if isinstance(exc, CrmError):
        return exc
    if isinstance(exc, SalesforceError):
        return classify_salesforce_http(int(exc.status), exc.content, headers or {})
    if isinstance(exc, requests.Timeout):
        return RetryableError("timeout", type(exc).__name__)
    if isinstance(exc, requests.ConnectionError):
        return RetryableError("connection", type(exc).__name__)
    if isinstance(exc, requests.RequestException):
        return RetryableError("http", type(exc).__name__)
    if isinstance(exc, ValueError):  # unparsable JSON body from a proxy or load balancer
        return RetryableError("bad_response", type(exc).__name__)
    return RetryableError("unexpected", type(exc).__name__)


def parse_limit_info(value: str) -> dict[str, int]:
    """`api-usage=18/15000; per-app-api-usage=...` -> {"used": 18, "total": 15000}."""
    m = re.search(r"(?:^|[;\s])api-usage=(\d+)/(\d+)", value)
    return {"used": int(m.group(1)), "total": int(m.group(2))} if m else {}


@dataclass(frozen=True)
class SalesforceSettings:
    """One Salesforce org. `auth["method"]`: client_credentials | jwt | password | session."""

    instance_url: str
    auth: dict[str, str] = field(repr=False)
    object: Literal["Lead", "Contact"] = "Lead"
    parent_field: str | None = None
    api_version: str = "62.0"
    timeout: float = 30.0
    # Read by changed_since (the poll); fetch_records reads only what it is asked for.
    extra_fields: tuple[str, ...] = ()
    token_url: str | None = None
    pool_size: int = 16
    # Lead-to-account matching: an Account field holding domain(s), read besides Website.
    account_domain_field: str | None = None

    @property
    def effective_parent_field(self) -> str | None:
        """Contacts default to AccountId; Leads have no parent unless configured."""
        return salesforce_parent_field(self.object, self.parent_field)


class RebasingSession(requests.Session):
    """A requests.Session that sends https://host URLs to the configured base (http allowed).

    simple-salesforce always builds https URLs; this lets it talk to a local http simulator. It
    also applies a default timeout and remembers the last Sforce-Limit-Info header.
    """

    def __init__(self, base_url: str, timeout: float, pool_size: int = 16) -> None:
        super().__init__()
        parts = urlsplit(base_url)
        self._scheme = parts.scheme or "https"
        self._netloc = parts.netloc
        self._timeout = timeout
        self.limit_info: dict[str, int] = {}
        self.limit_info_raw: str | None = None
        self._last = threading.local()  # this thread's last response headers
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def rebase(self, url: str) -> str:
        """Rewrite the scheme of URLs aimed at our host (simple-salesforce forces https)."""
        parts = urlsplit(url)
        if parts.netloc == self._netloc and parts.scheme != self._scheme:
            return urlunsplit((self._scheme, *parts[1:]))
        return url

    def request(
        self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any
    ) -> requests.Response:
        if isinstance(url, bytes):
            url = url.decode()
        kwargs.setdefault("timeout", self._timeout)
        resp = super().request(method, self.rebase(url), *args, **kwargs)
        self._last.headers = resp.headers
        info = resp.headers.get("Sforce-Limit-Info")
        if info:
            self.limit_info_raw = info
            parsed = parse_limit_info(info)
            if parsed:
                self.limit_info = parsed
        return resp

    def last_headers(self) -> Mapping[str, str]:
        """The headers of the last response this thread received (for a failed call's
        Retry-After, which simple-salesforce's exceptions drop)."""
        return getattr(self._last, "headers", None) or {}


def _parse_sf_datetime(value: str) -> datetime:
    """'2024-05-01T12:00:00.000+0000' -> aware datetime."""
    v = value.strip()
    if v.endswith("Z"):
        v = v[:-1] + "+00:00"
    elif re.search(r"[+-]\d{4}$", v):
        v = v[:-2] + ":" + v[-2:]
    dt = datetime.fromisoformat(v)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _soql_datetime(dt: datetime, *, ceil: bool = False) -> str:
    """SOQL datetime literal at second precision (floored, or ceiled for upper bounds)."""
    aware = dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    u = aware.astimezone(UTC)
    if ceil and u.microsecond:
        u = u + timedelta(seconds=1)
    return u.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _as_utc(dt: datetime) -> datetime:
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).astimezone(UTC)


def _str_or_none(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class SalesforceAdapter:
    """CrmAdapter for one Salesforce org (Lead or Contact owner writes)."""

    kind = "salesforce"
    max_batch = 200
    owner_field = SALESFORCE_OWNER_FIELD

    def __init__(self, settings: SalesforceSettings) -> None:
        method = settings.auth.get("method", "")
        if method not in ("client_credentials", "jwt", "password", "session"):
            raise ValueError(f"unknown Salesforce auth method {method!r}")
        for f in (*settings.extra_fields, settings.account_domain_field or "Website"):
            if not _FIELD_RE.match(f):
                raise ValueError(f"invalid field name {f!r}")
        self.settings = settings
        self._session = RebasingSession(settings.instance_url, settings.timeout, settings.pool_size)
        self._lock = threading.Lock()
        self._sf: Salesforce | None = None
        self._token_fetches = 0

    # ----------------------------------------------------------------- auth and client
    def _token_endpoint(self) -> str:
        base = self.settings.token_url or self.settings.instance_url
        return base.rstrip("/") + "/services/oauth2/token"

    def _fetch_token(self) -> str:
        """Obtain an access token for the configured auth method (never logged)."""
        a = self.settings.auth
        method = a["method"]
        if method == "session":
            return a["access_token"]
        data: dict[str, str]
        if method == "client_credentials":
            data = {
                "grant_type": "client_credentials",
                "client_id": a["client_id"],
                "client_secret": a["client_secret"],
            }
        elif method == "password":
            data = {
                "grant_type": "password",
                "username": a["username"],
                "password": a["password"] + a.get("security_token", ""),
            }
            if a.get("client_id"):
                data["client_id"] = a["client_id"]
            if a.get("client_secret"):
                data["client_secret"] = a["client_secret"]
        else:
            data = {
                "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                "assertion": self._jwt_assertion(),
            }
        try:
            resp = self._session.post(self._token_endpoint(), data=data)
        except requests.RequestException as exc:
            raise classify_salesforce_exception(exc) from exc
        self._token_fetches += 1
        try:
            body: object = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict) or "access_token" not in body:
            if resp.status_code >= 500 or resp.status_code == 429:
                raise classify_salesforce_http(resp.status_code, body, dict(resp.headers))
            code, msg = _first_error(body)
            raise AuthError(code or f"token_{resp.status_code}", msg)
        return str(body["access_token"])

    def _jwt_assertion(self) -> str:
        import jwt  # PyJWT, a simple-salesforce dependency

        a = self.settings.auth
        key = a.get("private_key")
        if not key:
            with open(a["private_key_file"], encoding="utf-8") as fh:
                key = fh.read()
        claims = {
            "iss": a["client_id"],
            "sub": a["username"],
            "aud": a.get("audience", "https://login.salesforce.com"),
            "exp": int(time.time()) + 180,
        }
        return str(jwt.encode(claims, key, algorithm="RS256"))

    def _build_client(self, token: str) -> Salesforce:
        return Salesforce(
            instance_url=self.settings.instance_url,
            session_id=token,
            session=self._session,
            version=self.settings.api_version,
        )

    def client(self) -> Salesforce:
        """The simple-salesforce client (token fetched lazily, shared across threads)."""
        with self._lock:
            if self._sf is None:
                self._sf = self._build_client(self._fetch_token())
            return self._sf

    def _refresh(self, stale: Salesforce) -> Salesforce:
        with self._lock:
            if self._sf is stale or self._sf is None:
                self._sf = self._build_client(self._fetch_token())
            return self._sf

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run fn(sf, ...) mapping errors; refresh the token once on INVALID_SESSION_ID."""
        sf = self.client()
        for attempt in (0, 1):
            try:
                return fn(sf, *args, **kwargs)
            except SalesforceError as exc:
                err = classify_salesforce_exception(exc, self._session.last_headers())
                refreshable = attempt == 0 and self.settings.auth["method"] != "session"
                if isinstance(err, AuthError) and exc.status == 401 and refreshable:
                    log.info("salesforce session expired; refreshing token")
                    sf = self._refresh(sf)
                    continue
                raise err from exc
            except (requests.RequestException, ValueError) as exc:
                raise classify_salesforce_exception(exc) from exc
        raise AuthError("INVALID_SESSION_ID", "session still invalid after refresh")

    # ----------------------------------------------------------------- writes
    def write_owners(self, batch: Sequence[OwnerWrite]) -> list[WriteOutcome]:
        """PATCH composite/sobjects (allOrNone false); per-record results mapped in order."""
        if not batch:
            return []
        if len(batch) > self.max_batch:
            raise ValueError(f"batch of {len(batch)} exceeds {self.max_batch}")
        obj = self.settings.object
        payload = {
            "allOrNone": False,
            "records": [
                {"attributes": {"type": obj}, "id": w.record_id, SALESFORCE_OWNER_FIELD: w.owner_id}
                for w in batch
            ],
        }
        result = self._call(
            lambda sf: sf.restful("composite/sobjects", method="PATCH", json=payload)
        )
        if not isinstance(result, list) or len(result) != len(batch):
            raise RetryableError("bad_response", "composite result count does not match request")
        outcomes: list[WriteOutcome] = []
        for w, r in zip(batch, result, strict=True):
            if isinstance(r, dict) and r.get("success"):
                outcomes.append(WriteOutcome(w.key, True))
                continue
            errors = r.get("errors") if isinstance(r, dict) else None
            first = errors[0] if isinstance(errors, list) and errors else {}
            code = str(first.get("statusCode", "UNKNOWN")) if isinstance(first, dict) else "?"
            msg = str(first.get("message", "")) if isinstance(first, dict) else ""
            err = classify_salesforce_record_error(code, msg)
            log.info(
                "salesforce write failed record=%s code=%s",
                w.record_id,
                code,
                extra={"crm_id": w.record_id, "code": code},
            )
            outcomes.append(WriteOutcome(w.key, False, err))
        return outcomes

    # ----------------------------------------------------------------- reads
    def _fields(self, extra: Sequence[str], configured: bool = True) -> list[str]:
        wanted = ["Id", SALESFORCE_OWNER_FIELD, "SystemModstamp"]
        pf = self.settings.effective_parent_field
        if pf:
            wanted.append(pf)
        if configured:
            wanted.extend(self.settings.extra_fields)
        for f in extra:
            if not _FIELD_RE.match(f):
                raise ValueError(f"invalid field name {f!r}")
            wanted.append(f)
        seen: dict[str, None] = {}
        for f in wanted:
            seen.setdefault(f, None)
        return list(seen)

    def _to_record(self, row: Mapping[str, Any], fields: Sequence[str]) -> CrmRecord:
        values = {f: _str_or_none(row.get(f)) for f in fields if f not in ("Id", "SystemModstamp")}
        return CrmRecord(
            crm_id=str(row["Id"]),
            fields=values,
            modified_at=_parse_sf_datetime(str(row["SystemModstamp"])),
        )

    def _query_pages(self, soql: str, page_size: int) -> Iterator[list[dict[str, Any]]]:
        headers = {"Sforce-Query-Options": f"batchSize={max(1, min(page_size, 2000))}"}
        res = self._call(lambda sf: sf.query(soql, headers=headers))
        while True:
            yield list(res.get("records", []))
            nxt = res.get("nextRecordsUrl")
            if res.get("done", True) or not nxt:
                return
            res = self._call(
                lambda sf, n=nxt: sf.query_more(n, identifier_is_url=True, headers=headers)
            )

    def changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmRecord]]:
        """SOQL on SystemModstamp (since inclusive, until exclusive), nextRecordsUrl paging."""
        fields = self._fields(())
        lo = _as_utc(since)
        hi = _as_utc(until) if until is not None else None
        where = f"SystemModstamp >= {_soql_datetime(lo)}"
        if hi is not None:
            where += f" AND SystemModstamp < {_soql_datetime(hi, ceil=True)}"
        soql = (
            f"SELECT {', '.join(fields)} FROM {self.settings.object} WHERE {where} "
            "ORDER BY SystemModstamp ASC, Id ASC"
        )
        for rows in self._query_pages(soql, page_size):
            page = [self._to_record(r, fields) for r in rows]
            page = [r for r in page if r.modified_at >= lo and (hi is None or r.modified_at < hi)]
            if page:
                yield page

    def fetch_records(self, ids: Sequence[str], fields: Sequence[str]) -> list[CrmRecord]:
        """SELECT by Id IN (...) in chunks; malformed ids are treated as missing.

        Ids may be given in either form; a record answers for both (the API sends 18).
        """
        # Only what the caller asks for (plus id, owner, parent): an owner check before a
        # write must not fail on a rule field the org no longer has.
        cols = self._fields(fields, configured=False)
        valid = [i for i in dict.fromkeys(ids) if is_id(i)]
        found: dict[str, CrmRecord] = {}
        for i in range(0, len(valid), _IN_CHUNK):
            chunk = valid[i : i + _IN_CHUNK]
            id_list = ", ".join(f"'{x}'" for x in chunk)
            soql = f"SELECT {', '.join(cols)} FROM {self.settings.object} WHERE Id IN ({id_list})"
            for rows in self._query_pages(soql, 2000):
                for row in rows:
                    rec = self._to_record(row, cols)
                    found[id_key(rec.crm_id)] = rec
        return [found[id_key(i)] for i in ids if id_key(i) in found]

    def accounts_changed_since(
        self, since: datetime, until: datetime | None = None, page_size: int = 200
    ) -> Iterator[list[CrmAccount]]:
        """Accounts by SystemModstamp (since inclusive, until exclusive): Id, OwnerId, Website
        and the configured domain field, for the account mirror."""
        domain_fields = ["Website"]
        if self.settings.account_domain_field:
            domain_fields.append(self.settings.account_domain_field)
        cols = list(dict.fromkeys(["Id", "OwnerId", "SystemModstamp", *domain_fields]))
        lo = _as_utc(since)
        hi = _as_utc(until) if until is not None else None
        where = f"SystemModstamp >= {_soql_datetime(lo)}"
        if hi is not None:
            where += f" AND SystemModstamp < {_soql_datetime(hi, ceil=True)}"
        soql = (
            f"SELECT {', '.join(cols)} FROM Account WHERE {where} "
            "ORDER BY SystemModstamp ASC, Id ASC"
        )
        for rows in self._query_pages(soql, page_size):
            page = [
                CrmAccount(
                    crm_id=str(r["Id"]),
                    owner_id=_str_or_none(r.get("OwnerId")),
                    domain_values=tuple(_str_or_none(r.get(f)) for f in domain_fields),
                    modified_at=_parse_sf_datetime(str(r["SystemModstamp"])),
                )
                for r in rows
            ]
            page = [a for a in page if a.modified_at >= lo and (hi is None or a.modified_at < hi)]
            if page:
                yield page

    def check_owners(self, owner_ids: Sequence[str]) -> dict[str, str | None]:
        """Query User (Id, IsActive): None = active, else 'inactive' / 'not found'."""
        result: dict[str, str | None] = {o: "not found" for o in owner_ids}
        valid = [o for o in dict.fromkeys(owner_ids) if is_id(o)]
        active: dict[str, bool] = {}
        for i in range(0, len(valid), _IN_CHUNK):
            id_list = ", ".join(f"'{x}'" for x in valid[i : i + _IN_CHUNK])
            soql = f"SELECT Id, IsActive FROM User WHERE Id IN ({id_list})"
            for rows in self._query_pages(soql, 2000):
                for row in rows:
                    active[id_key(str(row["Id"]))] = bool(row.get("IsActive"))
        for o in owner_ids:
            if id_key(o) in active:
                result[o] = None if active[id_key(o)] else "inactive"
        return result

    def usage(self) -> dict[str, object]:
        """Last Sforce-Limit-Info api-usage seen on any response."""
        info = dict(self._session.limit_info)
        return {
            "kind": self.kind,
            "api_usage": info,
            "limit_info": self._session.limit_info_raw,
            "token_fetches": self._token_fetches,
        }
