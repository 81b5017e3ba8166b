"""Slack through slack-sdk's WebClient: a rep's direct message (chat.postMessage with the
user id as channel), the admin channel, the user found by email (users.lookupByEmail, cached),
and the token's scopes (auth.test) for `check-config --online`.

slack-sdk's own retries are turned off: a rate limit or an outage goes back to the dispatcher,
which sends the row again later (connector/notify/outcomes.py); nothing here sleeps.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from connector.core.notify_config import RepContact, SlackSettings
from connector.notify.messages import Message
from connector.notify.outcomes import ChannelDown, RateLimited, SendError, Undeliverable

#: The scopes the bot token needs (docs/notifications.md).
NEEDED_SCOPES = ("chat:write", "users:read", "users:read.email")
#: Errors that belong to the message or its recipient: the row is dead (retry after a fix).
_UNDELIVERABLE = frozenset(
    {
        "users_not_found",
        "user_not_found",
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "msg_too_long",
        "no_text",
        "invalid_blocks",
        "user_disabled",
        "cannot_dm_bot",
        "restricted_action",
        "invalid_arguments",
        "too_many_attachments",
    }
)
CACHE_SECONDS = 3600.0
#: slack-sdk logs each request's parameters (message text, email addresses) at DEBUG: its
#: logger here stays at WARNING whatever the connector's level.
_SDK_LOG = logging.getLogger("connector.notify.slack_sdk")
_SDK_LOG.setLevel(logging.WARNING)


class SlackSender:
    def __init__(self, settings: SlackSettings, *, clock: Any = time.monotonic) -> None:
        self.settings = settings
        self.client = WebClient(
            token=settings.bot_token.get_secret_value(),
            base_url=settings.base_url,
            timeout=int(max(1, settings.timeout_seconds)),
            retry_handlers=[],
            logger=_SDK_LOG,
        )
        self._ids: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def user_id(self, contact: RepContact | None, crm_user_id: str) -> str:
        """The rep's Slack user: from the YAML, else looked up by email (cached an hour)."""
        if contact is not None and contact.slack_user_id:
            return contact.slack_user_id
        if contact is None or not contact.email:
            raise Undeliverable(
                "no_address",
                f"rep {crm_user_id} has no email or slack_user_id in notifications.reps",
            )
        key = contact.email.lower()
        now = self._clock()
        with self._lock:
            hit = self._ids.get(key)
        if hit is not None and now - hit[1] < CACHE_SECONDS:
            return hit[0]
        answer = self._call("users_lookupByEmail", email=contact.email)
        uid = str(answer["user"]["id"])
        with self._lock:
            self._ids[key] = (uid, now)
        return uid

    def send(self, msg: Message, contact: RepContact | None) -> None:
        if msg.recipient == "admins":
            channel = self.settings.admin_channel
            if channel is None:
                raise Undeliverable("no_admin_channel", "notifications.slack.admin_channel unset")
        else:
            channel = self.user_id(contact, msg.recipient)
        self._call(
            "chat_postMessage",
            channel=channel,
            text=msg.text,
            unfurl_links=False,
            unfurl_media=False,
            metadata={
                "event_type": "lead_routing_notification",
                "event_payload": {"dedupe_key": msg.dedupe_key},
            },
        )

    def scopes(self) -> list[str]:
        """The token's scopes (auth.test's x-oauth-scopes header)."""
        answer = self._call("auth_test")
        header = answer.headers.get("x-oauth-scopes") or answer.headers.get("X-OAuth-Scopes")
        if isinstance(header, list):
            header = header[0] if header else ""
        return [s.strip() for s in str(header or "").split(",") if s.strip()]

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(**kwargs)
        except SlackApiError as exc:
            raise classify(
                exc.response.status_code, exc.response.data, exc.response.headers
            ) from None
        except (SlackClientError, OSError) as exc:
            raise ChannelDown("transport", type(exc).__name__) from None


def classify(status: int, body: Any, headers: Any) -> SendError:
    """A Slack answer that was not ok, as the dispatcher's error."""
    error = str(body.get("error", "")) if isinstance(body, dict) else ""
    if status == 429 or error == "ratelimited":
        retry = headers.get("Retry-After") or headers.get("retry-after") if headers else None
        if isinstance(retry, list):
            retry = retry[0] if retry else None
        try:
            seconds = float(retry) if retry is not None else 1.0
        except ValueError:
            seconds = 1.0
        return RateLimited("ratelimited", seconds)
    if error in _UNDELIVERABLE:
        return Undeliverable(error)
    return ChannelDown(error or f"http_{status}")
