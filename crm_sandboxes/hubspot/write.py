"""HubSpot simulator writes: batch update of contacts, leads and companies (owner checks,
archived records, poison records, 207 multi-status answers)."""

from __future__ import annotations

import json
import time
from typing import Any

from crm_sandboxes._server import Reply
from crm_sandboxes.hubspot.errors import _error
from crm_sandboxes.hubspot.records import HubSpotRecords, _iso


class HubSpotWrite(HubSpotRecords):
    """POST /crm/v3/objects/<type>/batch/update."""

    max_batch: int

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
