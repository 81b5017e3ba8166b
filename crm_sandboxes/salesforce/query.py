"""Salesforce simulator reads: SOQL execution over the org's records (Leads, Contacts,
Accounts, Users), query pagination with nextRecordsUrl cursors, and single-record GETs."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crm_sandboxes._server import Reply, Request
from crm_sandboxes.salesforce.records import (
    _BASE_FIELDS,
    _PREFIX,
    SalesforceRecords,
    _fmt_dt,
    _key,
    _Rec,
)
from crm_sandboxes.salesforce.soql import (
    _SOQL_RE,
    _cmp,
    _FieldError,
    _parse_where,
    _SoqlError,
    _sort_key,
)


@dataclass
class _Cursor:
    rows: list[dict[str, Any]]
    batch: int
    created: float = field(default_factory=time.monotonic)


def _value(rec: _Rec, name: str) -> Any:
    return rec.modstamp if name == "SystemModstamp" else rec.fields.get(name)


def _key_for(name: str) -> Callable[[_Rec], tuple[int, Any]]:
    def key(rec: _Rec) -> tuple[int, Any]:
        return _sort_key(_value(rec, name))

    return key


class SalesforceQuery(SalesforceRecords):
    """GET query, GET query/<locator>, GET sobjects/<type>/<id>."""

    def _row(self, rec: _Rec, fields: list[str], ver: str) -> dict[str, Any]:
        row: dict[str, Any] = {
            "attributes": {
                "type": rec.type,
                "url": f"/services/data/v{ver}/sobjects/{rec.type}/{rec.fields['Id']}",
            }
        }
        for f in fields:
            row[f] = _fmt_dt(rec.modstamp) if f == "SystemModstamp" else rec.fields.get(f)
        return row

    def _get_one(self, obj: str, rid: str, ver: str) -> Reply:
        with self._lock:
            rec = self._records.get(_key(rid))
            if rec is None or rec.type != obj or rec.deleted:
                return Reply(
                    404,
                    [
                        {
                            "errorCode": "NOT_FOUND",
                            "message": "The requested resource does not exist",
                        }
                    ],
                )
            fields = sorted(set(rec.fields) | {"SystemModstamp"})
            return Reply(200, self._row(rec, fields, ver))

    def _known_fields(self, obj: str) -> set[str]:
        known = set(_BASE_FIELDS.get(obj, {"Id"}))
        for r in self._records.values():
            if r.type == obj:
                known.update(r.fields)
        return known

    def _query(self, req: Request, ver: str) -> Reply:
        soql = req.q("q") or ""
        opts = req.header("Sforce-Query-Options") or ""
        bm = re.search(r"batchSize=(\d+)", opts)
        batch = min(max(int(bm.group(1)), 200), 2000) if bm else 2000
        try:
            rows = self._run_soql(soql, ver)
        except _SoqlError as exc:
            return Reply(400, [{"message": str(exc), "errorCode": "MALFORMED_QUERY"}])
        except _FieldError as exc:
            return Reply(400, [{"message": str(exc), "errorCode": "INVALID_FIELD"}])
        return self._page(rows, batch, ver, None, 0)

    def _page(
        self, rows: list[dict[str, Any]], batch: int, ver: str, cursor: str | None, offset: int
    ) -> Reply:
        chunk = rows[offset : offset + batch]
        done = offset + batch >= len(rows)
        body: dict[str, Any] = {"totalSize": len(rows), "done": done, "records": chunk}
        if not done:
            with self._lock:
                if cursor is None:
                    cursor = "01g" + secrets.token_hex(6).upper()
                    self._cursors[cursor] = _Cursor(rows, batch)
            body["nextRecordsUrl"] = f"/services/data/v{ver}/query/{cursor}-{offset + batch}"
        return Reply(200, body)

    def _query_more(self, locator: str, ver: str) -> Reply:
        cursor, _, off = locator.rpartition("-")
        with self._lock:
            cur = self._cursors.get(cursor)
        if cur is None or not off.isdigit():
            return Reply(
                400, [{"message": "invalid query locator", "errorCode": "INVALID_QUERY_LOCATOR"}]
            )
        return self._page(cur.rows, cur.batch, ver, cursor, int(off))

    def _run_soql(self, soql: str, ver: str) -> list[dict[str, Any]]:
        m = _SOQL_RE.match(soql)
        if not m:
            raise _SoqlError("unexpected token in query")
        fields = [f.strip() for f in m.group("fields").split(",") if f.strip()]
        obj = m.group("obj")
        obj = next((k for k in _PREFIX if k.lower() == obj.lower()), obj)
        if obj not in _PREFIX:
            raise _FieldError(f"sObject type '{obj}' is not supported.")
        conds = _parse_where(m.group("where"))
        order = [o.strip().split() for o in (m.group("order") or "").split(",") if o.strip()]
        with self._lock:
            known = self._known_fields(obj)
            for f in fields + [c[0] for c in conds] + [o[0] for o in order]:
                if f not in known:
                    raise _FieldError(f"No such column '{f}' on entity '{obj}'.")
            matched = [
                r
                for r in self._records.values()
                if r.type == obj and not r.deleted and all(self._test(r, c) for c in conds)
            ]
            for spec in reversed(order):
                desc = len(spec) > 1 and spec[1].upper() == "DESC"
                matched.sort(key=_key_for(spec[0]), reverse=desc)
            if m.group("limit"):
                matched = matched[: int(m.group("limit"))]
            return [self._row(r, fields, ver) for r in matched]

    def _test(self, rec: _Rec, cond: tuple[str, str, Any]) -> bool:
        name, op, val = cond
        have = _value(rec, name)
        if op in ("IN", "NOT IN"):
            inside = have in val
            return inside if op == "IN" else not inside
        return _cmp(have, op, val)
