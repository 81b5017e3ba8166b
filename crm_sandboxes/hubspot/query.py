"""HubSpot simulator reads: batch read and search of contacts, leads and companies (the
account mirror reads companies this way), and the owners endpoints. Search filtering and
sorting are plain functions."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from crm_sandboxes._server import Reply, Request
from crm_sandboxes.hubspot.errors import _error
from crm_sandboxes.hubspot.records import HubSpotRecords, _iso, _Obj

_DATE_PROPS = {"lastmodifieddate", "hs_lastmodifieddate", "createdate"}


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


def _value(o: _Obj, prop: str) -> Any:
    if prop in ("lastmodifieddate", "hs_lastmodifieddate"):
        return o.modified_ms
    if prop == "createdate":
        return o.created_ms
    if prop == "hs_object_id":
        return int(o.id)
    return o.properties.get(prop)


def _match(o: _Obj, f: dict[str, Any]) -> bool:
    """Whether the object passes one search filter (propertyName, operator, value...)."""
    prop = str(f.get("propertyName"))
    op = str(f.get("operator", "EQ"))
    have = _value(o, prop)
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


def _sort_key(prop: str) -> Callable[[_Obj], tuple[bool, Any]]:
    def key(o: _Obj) -> tuple[bool, Any]:
        v = _value(o, prop)
        return (v is None, v if v is not None else 0)

    return key


class HubSpotQuery(HubSpotRecords):
    """POST .../batch/read, POST .../search, GET /crm/v3/owners[/<id>]."""

    search_cap: int
    max_batch: int

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
                    or any(all(_match(o, f) for f in g.get("filters") or []) for g in groups)
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
