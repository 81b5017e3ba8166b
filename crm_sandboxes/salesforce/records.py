"""Salesforce simulator state: records, ids, modstamps, and the seeding and inspection helpers.

Ids are issued in the 18-character form; every helper accepts either form (15 or 18
characters, any case) and stores the 18-character one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from crm_adapters.salesforce_ids import id_key, to_18
from crm_sandboxes._server import SandboxServer

if TYPE_CHECKING:
    from crm_sandboxes.salesforce.query import _Cursor

_PREFIX = {"Lead": "00Q", "Contact": "003", "Account": "001", "User": "005"}
_BASE_FIELDS = {
    # Country is a standard Lead field (address compound), queryable in every org.
    "Lead": {
        "Id",
        "OwnerId",
        "SystemModstamp",
        "FirstName",
        "LastName",
        "Company",
        "Email",
        "Status",
        "Name",
        "Country",
        "Website",
    },
    "Contact": {
        "Id",
        "OwnerId",
        "SystemModstamp",
        "FirstName",
        "LastName",
        "AccountId",
        "Email",
        "Name",
    },
    "Account": {"Id", "OwnerId", "SystemModstamp", "Name", "Website"},
    "User": {"Id", "Username", "Name", "IsActive", "SystemModstamp"},
}


def _key(value: Any) -> Any:
    """The 18-character form of an id given in either form; anything else unchanged."""
    return id_key(value) if isinstance(value, str) else value


def _is_id_field(name: str) -> bool:
    return name == "Id" or name.endswith("Id")


def _fmt_dt(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}+0000"


@dataclass
class _Rec:
    type: str
    fields: dict[str, Any]
    modstamp: datetime
    deleted: bool = False


class SalesforceRecords(SandboxServer):
    """The org's data (Users, Accounts, Leads, Contacts) and the in-process helpers that
    seed and inspect it, as a person in the UI would; no HTTP here."""

    session_token: str

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
