"""HubSpot-specific fault knobs: the rolling ten-second, per-second search and daily rate
limits (with their X-HubSpot-RateLimit headers), and the kind-specific /_sandbox/ control
endpoints."""

from __future__ import annotations

import time
from collections import deque

from crm_sandboxes._server import Reply, Request, correlation_id
from crm_sandboxes.hubspot.records import HubSpotRecords


class HubSpotFaults(HubSpotRecords):
    """Rate limiting per token, and control endpoints on top of SandboxServer's generic ones."""

    limit_per_10s: int
    daily_limit: int | None
    search_per_s: int | None

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
