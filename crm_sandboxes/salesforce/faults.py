"""Salesforce-specific fault knobs: the daily API request limit (with its Sforce-Limit-Info
header), poison records, expired tokens, and the kind-specific /_sandbox/ control endpoints."""

from __future__ import annotations

from crm_sandboxes._server import Reply, Request
from crm_sandboxes.salesforce.records import SalesforceRecords, _key


class SalesforceFaults(SalesforceRecords):
    """Fault injection and control endpoints on top of the generic ones of SandboxServer."""

    api_limit: int

    def poison(self, ids: list[str] | set[str] | tuple[str, ...]) -> None:
        """Writes to these record ids (either form) always fail permanently."""
        super().poison([_key(i) for i in ids])

    def expire_tokens(self) -> None:
        """Invalidate every issued access token (the static session token too)."""
        with self._lock:
            self._tokens.clear()

    def _limit_header(self) -> dict[str, str]:
        with self._lock:
            return {"Sforce-Limit-Info": f"api-usage={self._api_used}/{self.api_limit}"}

    def _limit_error(self) -> Reply | None:
        """Count one API request; the 403 answer once the org is over its request limit."""
        with self._lock:
            self._api_used += 1
            over = self._api_used > self.api_limit
        if over:
            self._stat("limit_errors")
            body = [
                {"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}
            ]
            return Reply(403, body, self._limit_header())
        return None

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
