"""Local HubSpot CRM v3 simulator: batch update/read, search, owners, rolling rate limits.

The class is composed here from one mixin per concern: `records` (state, seeding and
inspection), `auth` (bearer tokens), `query` (batch read, search, owners), `write` (batch
update) and `faults` (rate limits, control endpoints); `errors` holds the error body. This
module holds the constructor and the routing of the API.
"""

from __future__ import annotations

from crm_sandboxes._server import Reply, Request
from crm_sandboxes.hubspot.auth import HubSpotAuth
from crm_sandboxes.hubspot.errors import _error
from crm_sandboxes.hubspot.faults import HubSpotFaults
from crm_sandboxes.hubspot.query import HubSpotQuery
from crm_sandboxes.hubspot.records import _OBJECTS
from crm_sandboxes.hubspot.write import HubSpotWrite

__all__ = ["HubSpotSandbox"]


class HubSpotSandbox(HubSpotAuth, HubSpotQuery, HubSpotWrite, HubSpotFaults):
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

    # ------------------------------------------------------------- HTTP API
    def _api(self, req: Request) -> Reply:
        token, refused = self._authenticate(req)
        if refused is not None:
            return refused
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
