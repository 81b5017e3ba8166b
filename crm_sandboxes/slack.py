"""Local Slack Web API simulator: the calls the connector makes (auth.test,
users.lookupByEmail, chat.postMessage), spoken to by the real slack-sdk ``WebClient`` through
``base_url``.

What it keeps from Slack: errors come as HTTP 200 ``{"ok": false, "error": ...}``
(``not_authed``, ``invalid_auth``, ``missing_scope`` with ``needed``/``provided``,
``users_not_found``, ``channel_not_found``, ``no_text``, ``msg_too_long``); rate limits
answer HTTP 429 ``{"ok": false, "error": "ratelimited"}`` with ``Retry-After`` in whole
seconds: chat.postMessage about one message per second per channel with a short burst
(a token bucket: ``per_channel_per_s``, ``burst``), users.lookupByEmail ``lookups_per_min``
(Tier 3); auth.test answers the token's scopes in ``x-oauth-scopes``. Accepted messages are
kept with the time they were accepted (``messages()``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any
from urllib.parse import parse_qs

from crm_sandboxes._server import Reply, Request, SandboxServer

__all__ = ["SlackSandbox"]

DEFAULT_SCOPES = ("chat:write", "users:read", "users:read.email")


class SlackSandbox(SandboxServer):
    """Slack simulator. Knobs: per_channel_per_s, burst, lookups_per_min, scopes."""

    kind = "slack"

    def __init__(
        self,
        per_channel_per_s: float = 1.0,
        burst: int = 3,
        lookups_per_min: int = 50,
        token: str = "xoxb-sandbox-token",
        scopes: tuple[str, ...] = DEFAULT_SCOPES,
    ) -> None:
        self.per_channel_per_s = per_channel_per_s
        self.burst = burst
        self.lookups_per_min = lookups_per_min
        self.token = token
        self.scopes = list(scopes)
        super().__init__()

    def _reset_state(self) -> None:
        self._users: dict[str, str] = {}  # email (lower case) -> user id
        self._channels: set[str] = set()
        self._buckets: dict[str, tuple[float, float]] = {}  # channel -> (tokens, at)
        self._lookups: list[float] = []
        self._messages: list[dict[str, Any]] = []
        self._ts = 0

    # ------------------------------------------------------------- seeding, inspection
    def add_user(self, email: str, user_id: str) -> None:
        with self._lock:
            self._users[email.lower()] = user_id

    def add_channel(self, channel_id: str) -> None:
        with self._lock:
            self._channels.add(channel_id)

    def messages(self) -> list[dict[str, Any]]:
        """Accepted messages, in order: channel, text, metadata, ts, accepted_at (epoch s)."""
        with self._lock:
            return [dict(m) for m in self._messages]

    # ------------------------------------------------------------- HTTP API
    def _api(self, req: Request) -> Reply:
        if not req.path.startswith("/api/"):
            return Reply(404, {"ok": False, "error": "unknown_method"})
        method = req.path[len("/api/") :]
        args = self._args(req)
        self._count(method)
        auth = req.header("Authorization") or ""
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else args.get("token")
        if not token:
            return _fail("not_authed")
        if token != self.token:
            return _fail("invalid_auth")
        if method == "auth.test":
            return Reply(
                200,
                {
                    "ok": True,
                    "url": "https://sandbox.slack.com/",
                    "team": "Sandbox",
                    "user": "lead-routing",
                    "team_id": "T0SANDBOX",
                    "user_id": "U0BOT",
                    "bot_id": "B0BOT",
                },
                {"x-oauth-scopes": ",".join(self.scopes)},
            )
        if method == "users.lookupByEmail":
            return self._lookup(args)
        if method == "chat.postMessage":
            return self._post(args)
        return _fail("unknown_method")

    @staticmethod
    def _args(req: Request) -> dict[str, Any]:
        args: dict[str, Any] = {k: v[0] for k, v in req.query.items() if v}
        ctype = (req.header("Content-Type") or "").lower()
        if req.body and ctype.startswith("application/json"):
            body = json.loads(req.body)
            if isinstance(body, dict):
                args.update(body)
        elif req.body:
            args.update({k: v[0] for k, v in parse_qs(req.body.decode()).items() if v})
        return args

    def _missing(self, needed: str) -> Reply | None:
        if needed in self.scopes:
            return None
        return Reply(
            200,
            {
                "ok": False,
                "error": "missing_scope",
                "needed": needed,
                "provided": ",".join(self.scopes),
            },
        )

    def _lookup(self, args: dict[str, Any]) -> Reply:
        refused = self._missing("users:read.email")
        if refused is not None:
            return refused
        now = time.monotonic()
        with self._lock:
            self._lookups = [t for t in self._lookups if now - t < 60.0]
            if len(self._lookups) >= self.lookups_per_min:
                wait = 60.0 - (now - self._lookups[0])
                self._stat("ratelimited")
                return _limited(wait)
            self._lookups.append(now)
            user = self._users.get(str(args.get("email", "")).lower())
        if user is None:
            return _fail("users_not_found")
        return Reply(200, {"ok": True, "user": {"id": user, "deleted": False}})

    def _take(self, channel: str) -> float:
        """0 when the channel's bucket has a message left, else the seconds until it has."""
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(channel, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.per_channel_per_s)
            if tokens >= 1.0:
                self._buckets[channel] = (tokens - 1.0, now)
                return 0.0
            self._buckets[channel] = (tokens, now)
            return (1.0 - tokens) / self.per_channel_per_s

    def _post(self, args: dict[str, Any]) -> Reply:
        refused = self._missing("chat:write")
        if refused is not None:
            return refused
        channel = str(args.get("channel") or "")
        with self._lock:
            known = channel in self._channels or channel in self._users.values()
        if not known:
            return _fail("channel_not_found")
        text = args.get("text")
        if not text and not args.get("blocks"):
            return _fail("no_text")
        if isinstance(text, str) and len(text) > 40_000:
            return _fail("msg_too_long")
        wait = self._take(channel)
        if wait > 0:
            self._stat("ratelimited")
            return _limited(wait)
        metadata = args.get("metadata")
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        with self._lock:
            self._ts += 1
            ts = f"{int(time.time())}.{self._ts:06d}"
            self._messages.append(
                {
                    "channel": channel,
                    "text": text,
                    "metadata": metadata,
                    "ts": ts,
                    "accepted_at": time.time(),
                }
            )
        return Reply(200, {"ok": True, "channel": channel, "ts": ts, "message": {"text": text}})

    def _control_extra(self, req: Request, action: str) -> Reply | None:
        if action == "messages":
            return Reply(200, {"messages": self.messages()})
        if action == "users" and req.method == "POST":
            data = req.json() or {}
            for email, uid in dict(data).items():
                self.add_user(str(email), str(uid))
            return Reply(200, {"ok": True})
        return None


def _fail(error: str) -> Reply:
    return Reply(200, {"ok": False, "error": error})


def _limited(wait_s: float) -> Reply:
    return Reply(
        429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(max(1, math.ceil(wait_s)))}
    )
