"""Local HubSpot CRM v3 simulator: batch update/read, search, owners, rolling rate limits."""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from crm_sandboxes._server import Reply, Request, SandboxServer, correlation_id

__all__ = ["HubSpotSandbox"]

_OBJECTS = ("contacts", "leads", "companies")
_DATE_PROPS = {"lastmodifieddate", "hs_lastmodifieddate", "createdate"}
_AUTH_MSG = (
    "Authentication credentials not found. This API supports OAuth 2.0 authentication and you "
    "can find more details at https://developers.hubspot.com/docs/methods/auth/oauth-overview"
)


def _iso(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _to_ms(value: Any) -> int | None:
    if value is None:
        return None
    s = str(value)
    if s.lstrip("-").isdigit():
        return int(s)
    try:
        dt = datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith("Z") else s)
    except ValueError:
        return None
    return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * 1000)


def _error(status: int, message: str, category: str, **extra: Any) -> Reply:
    body = {
        "status": "error",
        "message": message,
        "correlationId": correlation_id(),
        "category": category,
        **extra,
    }
    return Reply(status, body)


@dataclass
class _Obj:
    id: str
    properties: dict[str, str | None]
    created_ms: int
    modified_ms: int
    archived: bool = False


class HubSpotSandbox(SandboxServer):
    """HubSpot simulator. Knobs: limit_per_10s, daily_limit, search_per_s, search_cap."""

    kind = "hubspot"

    def __init__(
        self,
        limit_per_10s: int = 100,
        daily_limit: int | None = None,
        search_per_s: int | None = 5,
        search_cap: int = 10_000,
        max_batch: int = 100,
    ) -> None:
        self.limit_per_10s = limit_per_10s
        self.daily_limit = daily_limit
        self.search_per_s = search_per_s
        self.search_cap = search_cap
        self.max_batch = max_batch
        self.access_token = "sandbox-token"
        super().__init__()

    def _reset_state(self) -> None:
        self._objects: dict[str, dict[str, _Obj]] = {o: {} for o in _OBJECTS}
        self._owners: dict[str, dict[str, Any]] = {}
        self._rec_seq = itertools.count(1001)
        self._owner_seq = itertools.count(101)
        self._windows: dict[str, deque[float]] = {}
        self._search_windows: dict[str, deque[float]] = {}
        self._daily: dict[str, int] = {}
        self._last_ms = 0
        self._tokens: set[str] = {self.access_token}

    # ------------------------------------------------------------- seeding / inspection
    def _tick(self) -> int:
        """Epoch ms now, never going backwards (ties happen, as in HubSpot)."""
        self._last_ms = max(int(time.time() * 1000), self._last_ms)
        return self._last_ms

    def add_owner(self, first_name: str | None = None, archived: bool = False) -> str:
        """Create an owner; returns its id."""
        with self._lock:
            oid = str(next(self._owner_seq))
            now = _iso(self._tick())
            self._owners[oid] = {
                "id": oid,
                "email": f"owner{oid}@sandbox.example",
                "type": "PERSON",
                "firstName": first_name or f"Rep{oid}",
                "lastName": "Sandbox",
                "userId": 9000 + int(oid),
                "userIdIncludingInactive": 9000 + int(oid),
                "createdAt": now,
                "updatedAt": now,
                "archived": archived,
                "teams": [],
            }
            return oid

    def set_owner_archived(self, owner_id: str, archived: bool = True) -> None:
        """Archive (deactivate) or restore an owner."""
        with self._lock:
            self._owners[owner_id]["archived"] = archived

    def add_token(self, token: str) -> None:
        """Accept another private-app token (each gets its own rate windows)."""
        with self._lock:
            self._tokens.add(token)

    def add_record(
        self,
        object_type: str = "contacts",
        owner_id: str | None = None,
        properties: dict[str, str | None] | None = None,
        modified_ms: int | None = None,
    ) -> str:
        """Create a contact, lead or company; returns its id."""
        if object_type not in _OBJECTS:
            raise ValueError(f"object_type must be one of {_OBJECTS}")
        with self._lock:
            rid = str(next(self._rec_seq))
            ms = modified_ms if modified_ms is not None else self._tick()
            props: dict[str, str | None] = {"hubspot_owner_id": owner_id, "email": None}
            props.update(properties or {})
            self._objects[object_type][rid] = _Obj(rid, props, ms, ms)
            return rid

    # ------------------------------------------------------------- companies (matching)
    def add_company(
        self,
        owner_id: str | None = None,
        domain: str | None = None,
        website: str | None = None,
        name: str | None = None,
        modified_ms: int | None = None,
    ) -> str:
        """Create a company (owner, domain, website); returns its id. The account mirror
        reads companies with the real client's search API."""
        props: dict[str, str | None] = {
            "name": name,
            "domain": domain,
            "website": website,
        }
        return self.add_record("companies", owner_id, props, modified_ms)

    def edit_company(self, company_id: str, **properties: str | None) -> None:
        """A person edits a company (owner, domain, ...): bumps hs_lastmodifieddate."""
        with self._lock:
            o = self._objects["companies"][company_id]
            o.properties.update(properties)
            o.modified_ms = self._tick()

    # ------------------------------------------------------------- records
    def person_edit(
        self, record_id: str, owner_id: str | None, object_type: str = "contacts"
    ) -> None:
        """A person changes the record's owner in the UI (bumps its modification time)."""
        with self._lock:
            o = self._objects[object_type][record_id]
            o.properties["hubspot_owner_id"] = owner_id
            o.modified_ms = self._tick()

    def delete_record(self, record_id: str, object_type: str = "contacts") -> None:
        """Archive a record: later batch updates report OBJECT_NOT_FOUND for it."""
        with self._lock:
            self._objects[object_type][record_id].archived = True

    def _public(self, object_type: str, o: _Obj, wanted: list[str] | None) -> dict[str, Any]:
        mod = _iso(o.modified_ms)
        base: dict[str, str | None] = {
            "hs_object_id": o.id,
            "createdate": _iso(o.created_ms),
            "lastmodifieddate" if object_type == "contacts" else "hs_lastmodifieddate": mod,
        }
        allp = {**o.properties, **base, "lastmodifieddate": mod, "hs_lastmodifieddate": mod}
        props = base if wanted is None else {**base, **{k: allp.get(k) for k in wanted}}
        return {
            "id": o.id,
            "properties": props,
            "createdAt": _iso(o.created_ms),
            "updatedAt": mod,
            "archived": o.archived,
        }

    def get_record(self, record_id: str, object_type: str = "contacts") -> dict[str, Any] | None:
        """The record with all its properties, or None."""
        with self._lock:
            o = self._objects[object_type].get(record_id)
            return None if o is None else self._public(object_type, o, list(o.properties))

    def records(self, object_type: str = "contacts") -> list[dict[str, Any]]:
        """All records of a type with all properties."""
        with self._lock:
            return [
                self._public(object_type, o, list(o.properties))
                for o in self._objects[object_type].values()
            ]

    def owners(self) -> list[dict[str, Any]]:
        """All owners, archived included."""
        with self._lock:
            return [dict(o) for o in self._owners.values()]

    def seed(self, spec: dict[str, Any]) -> dict[str, list[str]]:
        """Bulk seed: {"owners": [{"first_name", "archived"}],
        "records": [{"object", "owner_id", "properties"}]} -> created ids."""
        out: dict[str, list[str]] = {"owners": [], "records": []}
        for o in spec.get("owners", []):
            out["owners"].append(self.add_owner(o.get("first_name"), bool(o.get("archived"))))
        for r in spec.get("records", []):
            out["records"].append(
                self.add_record(r.get("object", "contacts"), r.get("owner_id"), r.get("properties"))
            )
        return out

    def _control_extra(self, req: Request, action: str) -> Reply | None:
        obj = req.q("object") or "contacts"
        if action == "seed" and req.method == "POST":
            return Reply(200, self.seed(req.json() or {}))
        if action == "records" and req.method == "GET":
            return Reply(200, self.records(obj))
        if action.startswith("records/") and req.method == "GET":
            rec = self.get_record(action.split("/", 1)[1], obj)
            return Reply(200, rec) if rec else Reply(404, {"error": "not found"})
        if action == "owners" and req.method == "GET":
            return Reply(200, self.owners())
        if action == "delete" and req.method == "POST":
            data = req.json() or {}
            for rid in data.get("ids", []):
                self.delete_record(str(rid), data.get("object", "contacts"))
            return Reply(200, {"ok": True})
        return None

    # ------------------------------------------------------------- limits
    def _rate_headers(self, token: str) -> dict[str, str]:
        with self._lock:
            used = len(self._windows.get(token, ()))
            h = {
                "X-HubSpot-RateLimit-Interval-Milliseconds": "10000",
                "X-HubSpot-RateLimit-Max": str(self.limit_per_10s),
                "X-HubSpot-RateLimit-Remaining": str(max(self.limit_per_10s - used, 0)),
            }
            if self.daily_limit is not None:
                h["X-HubSpot-RateLimit-Daily"] = str(self.daily_limit)
                h["X-HubSpot-RateLimit-Daily-Remaining"] = str(
                    max(self.daily_limit - self._daily.get(token, 0), 0)
                )
            return h

    def _over_limit(self, token: str, search: bool) -> Reply | None:
        now = time.monotonic()
        with self._lock:
            if self.daily_limit is not None and self._daily.get(token, 0) >= self.daily_limit:
                return self._limited("DAILY", "You have reached your daily limit.")
            if search and self.search_per_s:
                sw = self._search_windows.setdefault(token, deque())
                while sw and now - sw[0] >= 1.0:
                    sw.popleft()
                if len(sw) >= self.search_per_s:
                    return self._limited("SECONDLY", "You have reached your secondly limit.")
                sw.append(now)
            else:
                w = self._windows.setdefault(token, deque())
                while w and now - w[0] >= 10.0:
                    w.popleft()
                if len(w) >= self.limit_per_10s:
                    return self._limited(
                        "TEN_SECONDLY_ROLLING", "You have reached your ten_secondly_rolling limit."
                    )
                w.append(now)
            self._daily[token] = self._daily.get(token, 0) + 1
            return None

    def _limited(self, policy: str, message: str) -> Reply:
        self._stats["rate_limited"] += 1
        self._stats[f"rate_limited_{policy.lower()}"] += 1
        body = {
            "status": "error",
            "message": message,
            "errorType": "RATE_LIMIT",
            "correlationId": correlation_id(),
            "policyName": policy,
        }
        return Reply(429, body)

    # ------------------------------------------------------------- HTTP API
    def _api(self, req: Request) -> Reply:
        auth = req.header("Authorization") or ""
        token = auth[7:] if auth.startswith("Bearer ") else ""
        with self._lock:
            ok = token in self._tokens
        if not ok:
            self._stat("auth_failures")
            return _error(401, _AUTH_MSG, "INVALID_AUTHENTICATION")
        parts = [p for p in req.path.split("/") if p]
        search = len(parts) == 5 and parts[4] == "search"
        limited = self._over_limit(token, search)
        if limited is not None:
            limited.headers.update(self._rate_headers(token))
            return limited
        reply = self._route(req, parts)
        if not search:
            reply.headers.update(self._rate_headers(token))
        return reply

    def _route(self, req: Request, parts: list[str]) -> Reply:
        if parts[:3] == ["crm", "v3", "owners"] and req.method == "GET":
            if len(parts) == 3:
                self._count("GET owners")
                return self._owner_page(req)
            if len(parts) == 4:
                self._count("GET owners/{id}")
                return self._owner_one(parts[3], req)
        if len(parts) >= 5 and parts[:3] == ["crm", "v3", "objects"] and req.method == "POST":
            obj = parts[3]
            if obj not in _OBJECTS:
                return _error(400, f"Unable to infer object type from: {obj}", "VALIDATION_ERROR")
            action = "/".join(parts[4:])
            body = req.json() or {}
            if action == "batch/update":
                self._count(f"POST {obj}/batch/update")
                return self._batch_update(obj, body)
            if action == "batch/read":
                self._count(f"POST {obj}/batch/read")
                return self._batch_read(obj, body)
            if action == "search":
                self._count(f"POST {obj}/search")
                return self._search(obj, body)
        return _error(404, "Resource not found", "OBJECT_NOT_FOUND")

    def _batch_update(self, obj: str, body: dict[str, Any]) -> Reply:
        started = _iso(int(time.time() * 1000))
        inputs = body.get("inputs") or []
        if len(inputs) > self.max_batch:
            return _error(
                400, f"Batch input cannot exceed {self.max_batch} inputs.", "VALIDATION_ERROR"
            )
        with self._lock:
            bad_owners = sorted(
                {
                    str(i["properties"]["hubspot_owner_id"])
                    for i in inputs
                    if "hubspot_owner_id" in (i.get("properties") or {})
                    and (i["properties"]["hubspot_owner_id"] not in (None, ""))
                    and (
                        str(i["properties"]["hubspot_owner_id"]) not in self._owners
                        or self._owners[str(i["properties"]["hubspot_owner_id"])]["archived"]
                    )
                }
            )
            if bad_owners:
                self._stats["validation_errors"] += 1
                detail = ", ".join(
                    json.dumps(
                        {
                            "isValid": False,
                            "message": f"{o} is not a valid owner id",
                            "error": "INVALID_OWNER_ID",
                            "name": "hubspot_owner_id",
                        }
                    )
                    for o in bad_owners
                )
                return _error(
                    400, f"Property values were not valid: [{detail}]", "VALIDATION_ERROR"
                )
            results: list[dict[str, Any]] = []
            missing: list[str] = []
            errors: list[dict[str, Any]] = []
            for inp in inputs:
                rid = str(inp.get("id"))
                o = self._objects[obj].get(rid)
                if o is None or o.archived:
                    missing.append(rid)
                    continue
                if rid in self._poison:
                    self._stats["poison_errors"] += 1
                    errors.append(
                        {
                            "status": "error",
                            "category": "VALIDATION_ERROR",
                            "message": "Sandbox poison record",
                            "context": {"ids": [rid]},
                            "errors": [],
                        }
                    )
                    continue
                for k, v in (inp.get("properties") or {}).items():
                    o.properties[k] = None if v is None else str(v)
                o.modified_ms = self._tick()
                self._stats["records_updated"] += 1
                results.append(self._public(obj, o, list(inp.get("properties") or {})))
            if missing:
                errors.insert(
                    0,
                    {
                        "status": "error",
                        "category": "OBJECT_NOT_FOUND",
                        "message": (
                            f"Could not get some {obj[:-1].upper()} objects, they may be deleted "
                            "or not exist. Check that ids are valid."
                        ),
                        "context": {"ids": missing},
                        "errors": [],
                    },
                )
        out: dict[str, Any] = {
            "status": "COMPLETE",
            "results": results,
            "startedAt": started,
            "completedAt": _iso(int(time.time() * 1000)),
        }
        if errors:
            out["numErrors"] = len(errors)
            out["errors"] = errors
            return Reply(207, out)
        return Reply(200, out)

    def _batch_read(self, obj: str, body: dict[str, Any]) -> Reply:
        started = _iso(int(time.time() * 1000))
        inputs = body.get("inputs") or []
        if len(inputs) > self.max_batch:
            return _error(
                400, f"Batch input cannot exceed {self.max_batch} inputs.", "VALIDATION_ERROR"
            )
        wanted = [str(p) for p in body.get("properties") or []]
        results: list[dict[str, Any]] = []
        missing: list[str] = []
        with self._lock:
            for inp in inputs:
                rid = str(inp.get("id"))
                o = self._objects[obj].get(rid)
                if o is None or o.archived:
                    missing.append(rid)
                else:
                    results.append(self._public(obj, o, wanted))
        out: dict[str, Any] = {
            "status": "COMPLETE",
            "results": results,
            "startedAt": started,
            "completedAt": _iso(int(time.time() * 1000)),
        }
        if missing:
            out["numErrors"] = 1
            out["errors"] = [
                {
                    "status": "error",
                    "category": "OBJECT_NOT_FOUND",
                    "message": f"Could not get some {obj[:-1].upper()} objects, they may be "
                    "deleted or not exist. Check that ids are valid.",
                    "context": {"ids": missing},
                    "errors": [],
                }
            ]
            return Reply(207, out)
        return Reply(200, out)

    @staticmethod
    def _value(o: _Obj, prop: str) -> Any:
        if prop in ("lastmodifieddate", "hs_lastmodifieddate"):
            return o.modified_ms
        if prop == "createdate":
            return o.created_ms
        if prop == "hs_object_id":
            return int(o.id)
        return o.properties.get(prop)

    def _match(self, o: _Obj, f: dict[str, Any]) -> bool:
        prop = str(f.get("propertyName"))
        op = str(f.get("operator", "EQ"))
        have = self._value(o, prop)
        conv = _to_ms if prop in _DATE_PROPS else (lambda v: None if v is None else str(v))
        if op == "HAS_PROPERTY":
            return have is not None
        if op == "NOT_HAS_PROPERTY":
            return have is None
        if op in ("IN", "NOT_IN"):
            vals = [conv(v) for v in f.get("values") or []]
            return (have in vals) == (op == "IN")
        want = conv(f.get("value"))
        if op == "EQ":
            return bool(have == want)
        if op == "NEQ":
            return bool(have != want)
        if have is None or want is None:
            return False
        if op == "BETWEEN":
            high = conv(f.get("highValue"))
            return high is not None and bool(want <= have <= high)
        cmp = {"GT": have > want, "GTE": have >= want, "LT": have < want, "LTE": have <= want}
        return bool(cmp.get(op, False))

    def _search(self, obj: str, body: dict[str, Any]) -> Reply:
        limit = int(body.get("limit") or 10)
        if limit > 200:
            return _error(400, "limit must be <= 200", "VALIDATION_ERROR")
        after = int(str(body.get("after") or "0") or 0)
        if after + limit > self.search_cap:
            self._stats["search_cap_errors"] += 1
            return _error(
                400,
                f"The search request exceeded the maximum of {self.search_cap} results. Narrow "
                "the search with filters instead of paging further.",
                "VALIDATION_ERROR",
            )
        groups = body.get("filterGroups") or []
        with self._lock:
            matched = [
                o
                for o in self._objects[obj].values()
                if not o.archived
                and (
                    not groups
                    or any(all(self._match(o, f) for f in g.get("filters") or []) for g in groups)
                )
            ]
            for s in reversed(body.get("sorts") or []):
                prop = str(s.get("propertyName"))
                desc = str(s.get("direction", "ASCENDING")).upper() == "DESCENDING"
                matched.sort(key=_sort_key(prop), reverse=desc)
            if not body.get("sorts"):
                matched.sort(key=lambda o: int(o.id))
            wanted = [str(p) for p in body.get("properties") or []]
            page = [self._public(obj, o, wanted or None) for o in matched[after : after + limit]]
        out: dict[str, Any] = {"total": len(matched), "results": page}
        if after + limit < len(matched):
            out["paging"] = {
                "next": {"after": str(after + limit), "link": "?after=" + str(after + limit)}
            }
        return Reply(200, out)

    def _owner_page(self, req: Request) -> Reply:
        limit = min(int(req.q("limit") or 100), 500)
        after = int(req.q("after") or 0)
        archived = (req.q("archived") or "false").lower() == "true"
        with self._lock:
            rows = [dict(o) for o in self._owners.values() if bool(o["archived"]) == archived]
        page = rows[after : after + limit]
        out: dict[str, Any] = {"results": page}
        if after + limit < len(rows):
            out["paging"] = {
                "next": {"after": str(after + limit), "link": "?after=" + str(after + limit)}
            }
        return Reply(200, out)

    def _owner_one(self, oid: str, req: Request) -> Reply:
        archived = (req.q("archived") or "false").lower() == "true"
        with self._lock:
            o = self._owners.get(oid)
            if o is None or bool(o["archived"]) != archived:
                return _error(404, f"Owner not found for id {oid}", "OBJECT_NOT_FOUND")
            return Reply(200, dict(o))


def _sort_key(prop: str) -> Callable[[_Obj], tuple[bool, Any]]:
    def key(o: _Obj) -> tuple[bool, Any]:
        v = HubSpotSandbox._value(o, prop)
        return (v is None, v if v is not None else 0)

    return key
