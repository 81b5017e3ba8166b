"""HubSpot simulator authentication: private-app bearer tokens."""

from __future__ import annotations

from crm_sandboxes._server import Reply, Request
from crm_sandboxes.hubspot.errors import _error
from crm_sandboxes.hubspot.records import HubSpotRecords

_AUTH_MSG = (
    "Authentication credentials not found. This API supports OAuth 2.0 authentication and you "
    "can find more details at https://developers.hubspot.com/docs/methods/auth/oauth-overview"
)


class HubSpotAuth(HubSpotRecords):
    """Accepts the configured access token and any added with `add_token`."""

    def add_token(self, token: str) -> None:
        """Accept another private-app token (each gets its own rate windows)."""
        with self._lock:
            self._tokens.add(token)

    def _authenticate(self, req: Request) -> tuple[str, Reply | None]:
        """The request's bearer token, and the 401 answer if it is not an accepted one."""
        auth = req.header("Authorization") or ""
        token = auth[7:] if auth.startswith("Bearer ") else ""
        with self._lock:
            ok = token in self._tokens
        if not ok:
            self._stat("auth_failures")
            return token, _error(401, _AUTH_MSG, "INVALID_AUTHENTICATION")
        return token, None
