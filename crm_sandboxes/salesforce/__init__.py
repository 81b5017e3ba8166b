"""Local Salesforce REST simulator: OAuth, SOQL subset, sObject Collections, row locks.

Like the real API it issues valid 18-character ids and accepts an id in either form, the
15-character one or the 18-character one in any case, wherever an id is given (record
writes and reads, SOQL conditions on Id fields, owner lookups); it always answers with the
18-character form.

The class is composed here from one mixin per concern: `records` (state, ids, seeding and
inspection), `auth` (OAuth tokens, session check), `query` (SOQL, pagination, record GETs;
the SOQL parsing itself is in `soql`), `write` (collections update, PATCH, row locks) and
`faults` (API limit, poison, expired tokens, control endpoints). This module holds the
constructor and the routing of the data API.
"""

from __future__ import annotations

import itertools
import re

from crm_sandboxes._server import Reply, Request
from crm_sandboxes.salesforce.auth import SalesforceAuth
from crm_sandboxes.salesforce.faults import SalesforceFaults
from crm_sandboxes.salesforce.query import SalesforceQuery
from crm_sandboxes.salesforce.write import SalesforceWrite, _LockTable

__all__ = ["SalesforceSandbox"]

_DATA_RE = re.compile(r"^/services/data/v(?P<ver>\d+\.\d+)(?P<rest>/.*)?$")


class SalesforceSandbox(SalesforceAuth, SalesforceQuery, SalesforceWrite, SalesforceFaults):
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

    # ------------------------------------------------------------- HTTP API
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
        refused = self._session_error(req) or self._limit_error()
        if refused is not None:
            return refused
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
