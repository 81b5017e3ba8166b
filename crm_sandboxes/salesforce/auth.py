"""Salesforce simulator authentication: the OAuth token endpoint (client credentials,
username-password, JWT bearer) and the session check on every data API call."""

from __future__ import annotations

import secrets
import time
from urllib.parse import parse_qs

from crm_sandboxes._server import Reply, Request
from crm_sandboxes.salesforce.records import SalesforceRecords

_SESSION_ERR = [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}]


class SalesforceAuth(SalesforceRecords):
    """Issues access tokens and rejects data API calls without a live one."""

    client_id: str
    client_secret: str
    username: str
    password: str
    security_token: str

    def _session_error(self, req: Request) -> Reply | None:
        """The 401 answer when the request's bearer token was not issued (or has expired)."""
        auth = req.header("Authorization") or ""
        token = auth[7:] if auth.startswith("Bearer ") else ""
        with self._lock:
            ok = token in self._tokens
        if not ok:
            self._stat("auth_failures")
            return Reply(401, _SESSION_ERR, {"WWW-Authenticate": 'Token realm="Salesforce"'})
        return None

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
