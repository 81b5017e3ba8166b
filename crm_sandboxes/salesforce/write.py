"""Salesforce simulator writes: sObject Collections update, single-record PATCH, and the row
lock table that makes concurrent saves of one record (or of children of one Account) wait
and then fail with UNABLE_TO_LOCK_ROW."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from typing import Any

from crm_adapters.salesforce_ids import is_id, to_18
from crm_sandboxes._server import Reply, Request
from crm_sandboxes.salesforce.records import SalesforceRecords, _is_id_field, _key


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


class SalesforceWrite(SalesforceRecords):
    """DML: each request is one transaction holding its row locks until it ends."""

    lock_wait_s: float
    record_work_ms: float
    request_work_ms: float
    max_collection: int
    _locks: _LockTable
    _txn: itertools.count[int]

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
