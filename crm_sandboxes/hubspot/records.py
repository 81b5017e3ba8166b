"""HubSpot simulator state: owners and CRM objects (contacts, leads, companies), their
timestamps and public JSON shape, and the seeding and inspection helpers."""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from crm_sandboxes._server import SandboxServer

_OBJECTS = ("contacts", "leads", "companies")


def _iso(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@dataclass
class _Obj:
    id: str
    properties: dict[str, str | None]
    created_ms: int
    modified_ms: int
    archived: bool = False


class HubSpotRecords(SandboxServer):
    """The portal's data and the in-process helpers that seed and inspect it, as a person in
    the UI would; no HTTP here."""

    access_token: str

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
