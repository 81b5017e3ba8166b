"""Local Salesforce REST simulator: OAuth, SOQL subset, sObject Collections, row locks.

Like the real API it issues valid 18-character ids and accepts an id in either form, the
15-character one or the 18-character one in any case, wherever an id is given (record
writes and reads, SOQL conditions on Id fields, owner lookups); it always answers with the
18-character form.
"""

from __future__ import annotations

import itertools
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from crm_adapters.salesforce_ids import id_key, is_id, to_18
from crm_sandboxes._server import Reply, Request, SandboxServer

__all__ = ["SalesforceSandbox"]

_PREFIX = {"Lead": "00Q", "Contact": "003", "Account": "001", "User": "005"}
_BASE_FIELDS = {
    # Country is a standard Lead field (address compound), queryable in every org.
    "Lead": {
        "Id",
        "OwnerId",
        "SystemModstamp",
        "LastName",
        "Company",
        "Email",
        "Status",
        "Name",
        "Country",
        "Website",
    },
    "Contact": {"Id", "OwnerId", "SystemModstamp", "LastName", "AccountId", "Email", "Name"},
    "Account": {"Id", "OwnerId", "SystemModstamp", "Name", "Website"},
    "User": {"Id", "Username", "Name", "IsActive", "SystemModstamp"},
}
_SESSION_ERR = [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}]
_DATA_RE = re.compile(r"^/services/data/v(?P<ver>\d+\.\d+)(?P<rest>/.*)?$")
_SOQL_RE = re.compile(
    r"^\s*SELECT\s+(?P<fields>.+?)\s+FROM\s+(?P<obj>\w+)"
    r"(?:\s+WHERE\s+(?P<where>.+?))?(?:\s+ORDER\s+BY\s+(?P<order>.+?))?"
    r"(?:\s+LIMIT\s+(?P<limit>\d+))?\s*$",
    re.I | re.S,
)
_COND_RE = re.compile(r"^\s*(\w+)\s*(>=|<=|!=|=|>|<)\s*(.+?)\s*$", re.S)
_IN_RE = re.compile(r"^\s*(\w+)\s+(NOT\s+IN|IN)\s*\((.*)\)\s*$", re.I | re.S)


def _key(value: Any) -> Any:
    """The 18-character form of an id given in either form; anything else unchanged."""
    return id_key(value) if isinstance(value, str) else value


def _is_id_field(name: str) -> bool:
    return name == "Id" or name.endswith("Id")


def _fmt_dt(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}+0000"


def _parse_literal(raw: str) -> Any:
    v = raw.strip()
    if len(v) >= 2 and v[0] == "'" and v[-1] == "'":
        return v[1:-1].replace("\\'", "'")
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if re.match(r"^\d{4}-\d{2}-\d{2}T", v):
        s = v[:-1] + "+00:00" if v.endswith("Z") else v
        if re.search(r"[+-]\d{4}$", s):
            s = s[:-2] + ":" + s[-2:]
        return datetime.fromisoformat(s)
    try:
        return float(v)
    except ValueError as exc:
        raise _SoqlError(f"unexpected token: '{v}'") from exc


class _SoqlError(Exception):
    pass


def _cmp(a: Any, op: str, b: Any) -> bool:
    if op == "=":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    if a is None or b is None:
        return False
    try:
        if op == ">":
            return bool(a > b)
        if op == ">=":
            return bool(a >= b)
        if op == "<":
            return bool(a < b)
        return bool(a <= b)
    except TypeError:
        return False


@dataclass
class _Rec:
    type: str
    fields: dict[str, Any]
    modstamp: datetime
    deleted: bool = False


@dataclass
class _Cursor:
    rows: list[dict[str, Any]]
    batch: int
    created: float = field(default_factory=time.monotonic)


class _LockTable:
    """Row locks held by a transaction until it ends; waiters give up after a timeout."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: dict[str, int] = {}

    def acquire(self, keys: Iterable[str], txn: int, timeout: float) -> bool:
        ks = list(keys)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if all(self._owner.get(k, txn) == txn for k in ks):
                    for k in ks:
                        self._owner[k] = txn
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)

    def release_all(self, txn: int) -> None:
        with self._cond:
            for k in [k for k, t in self._owner.items() if t == txn]:
                del self._owner[k]
            self._cond.notify_all()


class SalesforceSandbox(SandboxServer):
    """Salesforce simulator. Knobs (see `configure`): lock_wait_s, record_work_ms, api_limit."""

    kind = "salesforce"

    def __init__(
        self,
        lock_wait_s: float = 10.0,
        record_work_ms: float = 3.0,
        api_limit: int = 1_000_000,
        max_collection: int = 200,
        request_work_ms: float = 0.0,
    ) -> None:
        self.lock_wait_s = lock_wait_s
        self.record_work_ms = record_work_ms
        # Once per DML request, with its locks held: bulkified triggers, flows and the parent
        # Account's roll-up summaries run once per save, not once per record.
        self.request_work_ms = request_work_ms
        self.api_limit = api_limit
        self.max_collection = max_collection
        self.client_id = "sandbox-client"
        self.client_secret = "sandbox-secret"
        self.username = "integration@sandbox.example"
        self.password = "sandbox-password"
        self.security_token = "SANDBOXTOKEN"
        self.session_token = "00DSANDBOX0000001!sandbox-session"
        self._locks = _LockTable()
        self._txn = itertools.count(1)
        super().__init__()

    def _reset_state(self) -> None:
        self._records: dict[str, _Rec] = {}
        self._seq = itertools.count(1)
        self._tokens: set[str] = {self.session_token}
        self._cursors: dict[str, _Cursor] = {}
        self._api_used = 0
        self._last_stamp = datetime(2000, 1, 1, tzinfo=UTC)

    # ------------------------------------------------------------- seeding / inspection
    def _new_id(self, obj: str) -> str:
        n = next(self._seq)
        return to_18(f"{_PREFIX[obj]}SB{n:010d}")

    def _tick(self) -> datetime:
        """SystemModstamp now, at 1 ms resolution, never going backwards (ties happen)."""
        now = datetime.now(UTC)
        now = now.replace(microsecond=(now.microsecond // 1000) * 1000)
        self._last_stamp = max(now, self._last_stamp)
        return self._last_stamp

    def add_user(self, name: str | None = None, active: bool = True) -> str:
        """Create a User; returns its Id."""
        with self._lock:
            uid = self._new_id("User")
            nm = name or f"Rep {uid[-7:-3]}"
            self._records[uid] = _Rec(
                "User",
                {"Id": uid, "Name": nm, "Username": f"{uid}@sandbox.example", "IsActive": active},
                self._tick(),
            )
            return uid

    def set_user_active(self, user_id: str, active: bool) -> None:
        """Activate or deactivate a User."""
        with self._lock:
            rec = self._records[_key(user_id)]
            rec.fields["IsActive"] = active
            rec.modstamp = self._tick()

    # ------------------------------------------------------------- accounts (matching)
    def add_account(
        self,
        name: str | None = None,
        owner_id: str | None = None,
        website: str | None = None,
        fields: dict[str, Any] | None = None,
        modstamp: datetime | None = None,
    ) -> str:
        """Create an Account (owner, Website and any custom fields, e.g. Domain__c); returns
        its Id. Read back with SOQL on Account, as the account mirror does."""
        with self._lock:
            aid = self._new_id("Account")
            f: dict[str, Any] = {"Id": aid, "Name": name or f"Account {aid[-7:-3]}"}
            f["OwnerId"] = _key(owner_id) if owner_id else None
            f["Website"] = website
            f.update(fields or {})
            f["Id"] = aid
            self._records[aid] = _Rec("Account", f, modstamp or self._tick())
            return aid

    def edit_account(self, account_id: str, **values: Any) -> None:
        """A person edits an Account (owner, Website, ...): bumps its SystemModstamp."""
        with self._lock:
            rec = self._records[_key(account_id)]
            for k, v in values.items():
                rec.fields[k] = _key(v) if _is_id_field(k) and v else v
            rec.modstamp = self._tick()

    # ------------------------------------------------------------- records

    def add_record(
        self,
        obj: str = "Lead",
        owner_id: str | None = None,
        account_id: str | None = None,
        fields: dict[str, Any] | None = None,
        modstamp: datetime | None = None,
    ) -> str:
        """Create a Lead or Contact (Contacts may have a parent Account); returns its Id."""
        if obj not in ("Lead", "Contact"):
            raise ValueError("obj must be Lead or Contact")
        with self._lock:
            rid = self._new_id(obj)
            f: dict[str, Any] = {"Id": rid, "OwnerId": owner_id, "LastName": f"Person {rid[-7:-3]}"}
            if obj == "Contact":
                f["AccountId"] = account_id
            else:
                f["Company"] = "Sandbox Inc"
            f.update(fields or {})
            f["Id"] = rid
            for name in ("OwnerId", "AccountId"):
                if name in f:
                    f[name] = _key(f[name])
            stamp = modstamp if modstamp is not None else self._tick()
            self._records[rid] = _Rec(obj, f, stamp)
            return rid

    def person_edit(self, record_id: str, owner_id: str | None) -> None:
        """A person changes the record's owner in the UI (bumps SystemModstamp, no API call)."""
        with self._lock:
            rec = self._records[_key(record_id)]
            rec.fields["OwnerId"] = _key(owner_id) if owner_id else None
            rec.modstamp = self._tick()

    def person_set(self, record_id: str, field: str, value: Any) -> None:
        """A person changes one field of the record in the UI (e.g. works the lead: Status)."""
        with self._lock:
            rec = self._records[_key(record_id)]
            rec.fields[field] = _key(value) if _is_id_field(field) else value
            rec.modstamp = self._tick()

    def delete_record(self, record_id: str) -> None:
        """Soft-delete (recycle bin): later writes fail with ENTITY_IS_DELETED."""
        with self._lock:
            self._records[_key(record_id)].deleted = True

    def get_record(self, record_id: str) -> dict[str, Any] | None:
        """A copy of the record's fields plus SystemModstamp and IsDeleted."""
        with self._lock:
            r = self._records.get(_key(record_id))
            if r is None:
                return None
            return {
                **r.fields,
                "SystemModstamp": _fmt_dt(r.modstamp),
                "IsDeleted": r.deleted,
                "type": r.type,
            }

    def records(self, obj: str | None = None) -> list[dict[str, Any]]:
        """All records (optionally of one type)."""
        with self._lock:
            ids = [k for k, r in self._records.items() if obj is None or r.type == obj]
        return [r for r in (self.get_record(i) for i in ids) if r is not None]

    def poison(self, ids: list[str] | set[str] | tuple[str, ...]) -> None:
        """Writes to these record ids (either form) always fail permanently."""
        super().poison([_key(i) for i in ids])

    def expire_tokens(self) -> None:
        """Invalidate every issued access token (the static session token too)."""
        with self._lock:
            self._tokens.clear()

    def seed(self, spec: dict[str, Any]) -> dict[str, list[str]]:
        """Bulk seed: {"users": [{"name", "active"}],
        "accounts": [{"name", "owner_id", "website", "fields"}],
        "records": [{"object", "owner_id", "account_id", "fields"}]} -> created ids."""
        out: dict[str, list[str]] = {"users": [], "accounts": [], "records": []}
        for u in spec.get("users", []):
            out["users"].append(self.add_user(u.get("name"), bool(u.get("active", True))))
        for a in spec.get("accounts", []):
            out["accounts"].append(
                self.add_account(
                    a.get("name"), a.get("owner_id"), a.get("website"), a.get("fields")
                )
            )
        for r in spec.get("records", []):
            out["records"].append(
                self.add_record(
                    r.get("object", "Lead"), r.get("owner_id"), r.get("account_id"), r.get("fields")
                )
            )
        return out

    def _control_extra(self, req: Request, action: str) -> Reply | None:
        if action == "seed" and req.method == "POST":
            return Reply(200, self.seed(req.json() or {}))
        if action == "records" and req.method == "GET":
            return Reply(200, self.records(req.q("object")))
        if action.startswith("records/") and req.method == "GET":
            rec = self.get_record(action.split("/", 1)[1])
            return Reply(200, rec) if rec else Reply(404, {"error": "not found"})
        if action == "users" and req.method == "GET":
            return Reply(200, self.records("User"))
        if action == "delete" and req.method == "POST":
            for rid in (req.json() or {}).get("ids", []):
                self.delete_record(str(rid))
            return Reply(200, {"ok": True})
        if action == "expire_tokens" and req.method == "POST":
            self.expire_tokens()
            return Reply(200, {"ok": True})
        return None

    # ------------------------------------------------------------- HTTP API
    def _limit_header(self) -> dict[str, str]:
        with self._lock:
            return {"Sforce-Limit-Info": f"api-usage={self._api_used}/{self.api_limit}"}

    def _api(self, req: Request) -> Reply:
        if req.path == "/services/oauth2/token" and req.method == "POST":
            self._count("POST oauth2/token")
            return self._token(req)
        m = _DATA_RE.match(req.path)
        if not m:
            return Reply(
                404,
                [{"errorCode": "NOT_FOUND", "message": "The requested resource does not exist"}],
            )
        auth = req.header("Authorization") or ""
        token = auth[7:] if auth.startswith("Bearer ") else ""
        with self._lock:
            ok = token in self._tokens
        if not ok:
            self._stat("auth_failures")
            return Reply(401, _SESSION_ERR, {"WWW-Authenticate": 'Token realm="Salesforce"'})
        with self._lock:
            self._api_used += 1
            over = self._api_used > self.api_limit
        if over:
            self._stat("limit_errors")
            body = [
                {"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}
            ]
            return Reply(403, body, self._limit_header())
        ver, rest = m.group("ver"), m.group("rest") or "/"
        reply = self._route(req, ver, rest)
        reply.headers.update(self._limit_header())
        return reply

    def _route(self, req: Request, ver: str, rest: str) -> Reply:
        parts = [p for p in rest.split("/") if p]
        if parts == ["composite", "sobjects"] and req.method == "PATCH":
            self._count("PATCH composite/sobjects")
            return self._collection_update(req)
        if parts == ["query"] and req.method == "GET":
            self._count("GET query")
            return self._query(req, ver)
        if len(parts) == 2 and parts[0] == "query" and req.method == "GET":
            self._count("GET query_more")
            return self._query_more(parts[1], ver)
        if len(parts) == 3 and parts[0] == "sobjects":
            if req.method == "GET":
                self._count("GET sobjects")
                return self._get_one(parts[1], parts[2], ver)
            if req.method == "PATCH":
                self._count("PATCH sobjects")
                return self._patch_one(parts[1], parts[2], req.json() or {})
        return Reply(
            404, [{"errorCode": "NOT_FOUND", "message": "The requested resource does not exist"}]
        )

    def _token(self, req: Request) -> Reply:
        form = {k: v[0] for k, v in parse_qs(req.body.decode()).items()}
        grant = form.get("grant_type", "")
        ok = False
        if grant == "client_credentials":
            ok = (
                form.get("client_id") == self.client_id
                and form.get("client_secret") == self.client_secret
            )
        elif grant == "password":
            ok = form.get("username") == self.username and form.get("password") == (
                self.password + self.security_token
            )
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            ok = self._jwt_ok(form.get("assertion", ""))
        if not ok:
            self._stat("auth_failures")
            return Reply(
                400, {"error": "invalid_grant", "error_description": "authentication failure"}
            )
        token = "00DSANDBOX0000001!" + secrets.token_urlsafe(24)
        with self._lock:
            self._tokens.add(token)
        host = req.header("Host") or "127.0.0.1"
        return Reply(
            200,
            {
                "access_token": token,
                "instance_url": f"http://{host}",
                "id": f"http://{host}/id/00DSANDBOX0000001/005SANDBOX0000001",
                "token_type": "Bearer",
                "issued_at": str(int(time.time() * 1000)),
                "signature": secrets.token_urlsafe(16),
            },
        )

    def _jwt_ok(self, assertion: str) -> bool:
        """JWT bearer: claims checked (iss, sub); the signature is NOT verified here."""
        import jwt

        try:
            claims = jwt.decode(assertion, options={"verify_signature": False})
        except jwt.PyJWTError:
            return False
        return claims.get("iss") == self.client_id and claims.get("sub") == self.username

    # ------------------------------------------------------------- writes
    def _update(
        self, obj: str | None, rid: Any, values: dict[str, Any], txn: int
    ) -> dict[str, Any] | None:
        """Apply one record update inside transaction `txn`; returns an error dict or None."""
        if not isinstance(rid, str) or not is_id(rid):
            return {
                "statusCode": "MALFORMED_ID",
                "message": f"{obj} ID: id value of incorrect type: {rid}",
                "fields": ["Id"],
            }
        rid = to_18(rid)
        with self._lock:
            rec = self._records.get(rid)
            parent = rec.fields.get("AccountId") if rec else None
        if rec is None or (obj is not None and rec.type != obj):
            return {
                "statusCode": "INVALID_CROSS_REFERENCE_KEY",
                "message": "invalid cross reference id",
                "fields": [],
            }
        if rec.deleted:
            return {"statusCode": "ENTITY_IS_DELETED", "message": "entity is deleted", "fields": []}
        keys = [rid] + ([str(parent)] if parent else [])
        if not self._locks.acquire(keys, txn, self.lock_wait_s):
            self._stat("lock_errors")
            return {
                "statusCode": "UNABLE_TO_LOCK_ROW",
                "message": f"unable to obtain exclusive access to this record or 1 records: {rid}",
                "fields": [],
            }
        if self.record_work_ms > 0:
            time.sleep(self.record_work_ms / 1000.0)
        if "OwnerId" in values:
            with self._lock:
                owner = self._records.get(_key(str(values["OwnerId"])))
            if owner is None or owner.type != "User" or owner.deleted:
                return {
                    "statusCode": "INVALID_CROSS_REFERENCE_KEY",
                    "message": "invalid cross reference id",
                    "fields": ["OwnerId"],
                }
            if not owner.fields.get("IsActive"):
                return {
                    "statusCode": "INACTIVE_OWNER_OR_USER",
                    "message": (
                        f"operation performed with inactive user [{owner.fields['Id']}]"
                        f" as owner of {rec.type.lower()}"
                    ),
                    "fields": [],
                }
        if self._is_poison(rid):
            self._stat("poison_errors")
            return {
                "statusCode": "FIELD_CUSTOM_VALIDATION_EXCEPTION",
                "message": "Sandbox poison record",
                "fields": [],
            }
        with self._lock:
            for k, v in values.items():
                if k not in ("attributes", "id", "Id"):
                    rec.fields[k] = _key(v) if _is_id_field(k) else v
            rec.modstamp = self._tick()
            self._stat("records_updated")
        return None

    def _request_work(self) -> None:
        if self.request_work_ms > 0:
            time.sleep(self.request_work_ms / 1000.0)

    def _collection_update(self, req: Request) -> Reply:
        body = req.json() or {}
        records = body.get("records") or []
        if len(records) > self.max_collection:
            return Reply(
                400,
                [
                    {
                        "message": (
                            "record limit reached. cannot submit more than "
                            f"{self.max_collection} records into this call"
                        ),
                        "errorCode": "EXCEEDED_ID_LIMIT",
                    }
                ],
            )
        if body.get("allOrNone"):
            return Reply(
                400, [{"message": "allOrNone true is not simulated", "errorCode": "INVALID_FIELD"}]
            )
        txn = next(self._txn)
        results: list[dict[str, Any]] = []
        try:
            for r in records:
                obj = (r.get("attributes") or {}).get("type")
                rid = r.get("id")
                err = self._update(obj, rid, r, txn)
                rid = _key(rid)  # answers carry the 18-character id
                if err is None:
                    results.append({"id": rid, "success": True, "errors": []})
                else:
                    results.append({"id": rid, "success": False, "errors": [err]})
            self._request_work()
        finally:
            self._locks.release_all(txn)
        return Reply(200, results)

    def _patch_one(self, obj: str, rid: str, values: dict[str, Any]) -> Reply:
        txn = next(self._txn)
        try:
            err = self._update(obj, rid, values, txn)
            self._request_work()
        finally:
            self._locks.release_all(txn)
        if err is None:
            return Reply(204)
        status = (
            404 if err["statusCode"] == "INVALID_CROSS_REFERENCE_KEY" and not err["fields"] else 400
        )
        return Reply(
            status,
            [{"message": err["message"], "errorCode": err["statusCode"], "fields": err["fields"]}],
        )

    # ------------------------------------------------------------- reads
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
        conds = self._parse_where(m.group("where"))
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

    @staticmethod
    def _value(rec: _Rec, name: str) -> Any:
        return rec.modstamp if name == "SystemModstamp" else rec.fields.get(name)

    def _test(self, rec: _Rec, cond: tuple[str, str, Any]) -> bool:
        name, op, val = cond
        have = self._value(rec, name)
        if op in ("IN", "NOT IN"):
            inside = have in val
            return inside if op == "IN" else not inside
        return _cmp(have, op, val)

    @staticmethod
    def _parse_where(where: str | None) -> list[tuple[str, str, Any]]:
        if not where:
            return []
        out: list[tuple[str, str, Any]] = []
        for part in re.split(r"\s+AND\s+", where, flags=re.I):
            im = _IN_RE.match(part)
            if im:
                name = im.group(1)
                vals = [_parse_literal(v) for v in im.group(3).split(",") if v.strip()]
                if _is_id_field(name):  # an id matches in either form
                    vals = [_key(v) for v in vals]
                out.append((name, " ".join(im.group(2).upper().split()), vals))
                continue
            cm = _COND_RE.match(part)
            if not cm:
                raise _SoqlError(f"unexpected token: '{part.strip()}'")
            name, value = cm.group(1), _parse_literal(cm.group(3))
            out.append((name, cm.group(2), _key(value) if _is_id_field(name) else value))
        return out


class _FieldError(Exception):
    pass


def _sort_key(v: Any) -> tuple[int, Any]:
    if v is None:
        return (0, "")
    if isinstance(v, datetime):
        return (1, v.timestamp())
    if isinstance(v, bool | int | float):
        return (1, float(v))
    return (2, str(v))


def _key_for(name: str) -> Callable[[_Rec], tuple[int, Any]]:
    def key(rec: _Rec) -> tuple[int, Any]:
        return _sort_key(SalesforceSandbox._value(rec, name))

    return key
