"""The notification dispatcher: sends queued notifications through Slack and email.

Delivered like owner writes (connector/writeback/dispatch.py): any number of dispatchers
claim ready rows with ``SKIP LOCKED`` under a lease in a short transaction, send with no
transaction open, and record every row's outcome in one statement that touches only rows
still claimed with their token (a dead dispatcher's late result changes nothing; its rows are
claimed again once the lease has expired). At least once: a crash between Slack's or the
relay's acceptance and the finish sends the message again, with the same dedupe key.

A rep's rows on one channel in one claim go out as one message (a digest when there are
several); a quiet rep's rows are held for their digest (connector/notify/quiet.py). A rate
limit (Slack's Retry-After) or an outage of a channel sends that recipient's (or channel's)
remaining rows back for later without trying them, so one round never waits on a limit.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Engine, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.notify_config import RepContact
from connector.notify.messages import Message, Row, plan_messages
from connector.notify.outcomes import (
    ChannelDown,
    Outcome,
    RateLimited,
    SendError,
    after_failure,
    held,
    not_tried,
    sent,
)
from connector.notify.quiet import RECHECK_SECONDS, is_quiet

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("notify").items()}


class Sender(Protocol):
    def send(self, msg: Message, contact: RepContact | None) -> None: ...


@dataclass
class NotifyStats:
    claimed: int = 0
    messages: int = 0
    sent: int = 0
    dead: int = 0
    retried: int = 0
    held: int = 0
    rate_limited: int = 0
    accepted_at: list[float] = field(default_factory=list)  # time.time() of each acceptance


def senders_for(cfg: OrgConfig) -> dict[str, Sender]:
    """The org's channels with settings: 'slack' and/or 'email'."""
    n = cfg.notifications
    out: dict[str, Sender] = {}
    if n is None:
        return out
    if n.slack is not None:
        from connector.notify.slack import SlackSender

        out["slack"] = SlackSender(n.slack)
    if n.email is not None:
        from connector.notify.email import EmailSender

        out["email"] = EmailSender(n.email)
    return out


def _row(r: Any) -> Row:
    detail = r.detail if isinstance(r.detail, dict) else json.loads(r.detail or "{}")
    fields = r.fields if isinstance(r.fields, dict) else json.loads(r.fields or "{}")
    return Row(
        id=r.id,
        kind=r.kind,
        channel=r.channel,
        recipient=r.recipient,
        dedupe_key=r.dedupe_key,
        attempts=r.attempts,
        created_at=r.created_at,
        lead_id=r.lead_id,
        detail=detail,
        held_since=r.held_since,
        crm_id=r.crm_id,
        fields=fields,
        team=r.team,
        rule_name=r.rule_name,
        owner_id=r.owner_id,
        away_from=r.away_from,
        away_until=r.away_until,
    )


#: The pace of one Slack channel (a rep's direct message, the admin channel): Slack takes
#: about one message per second per channel (short bursts aside), so a dispatcher sends no
#: sooner than this after its previous message there; what comes meanwhile waits and goes
#: out grouped.
SLACK_CHANNEL_INTERVAL_S = 1.0


class Pace:
    """When each (channel, recipient) may be sent to next: after Slack's pace or its
    Retry-After. Shared by the org's dispatchers in one process (thread-safe); another
    process learns a limit from Slack's 429 itself."""

    def __init__(
        self,
        slack_interval_s: float = SLACK_CHANNEL_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slack_interval_s = slack_interval_s
        self._next: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.clock = clock

    def wait(self, key: tuple[str, str]) -> float:
        with self._lock:
            return max(0.0, self._next.get(key, 0.0) - self.clock())

    def hold(self, key: tuple[str, str], seconds: float) -> None:
        with self._lock:
            at = self.clock() + seconds
            self._next[key] = max(self._next.get(key, 0.0), at)


class NotifyDispatcher:
    """Drains one org's notifications through its senders."""

    def __init__(
        self,
        engine: Engine,
        cfg: OrgConfig,
        senders: dict[str, Sender] | None = None,
        *,
        claim_limit: int = 200,
        lease_seconds: float = 120.0,
        poll_seconds: float = 0.5,
        now: Callable[[], datetime] | None = None,
        pace: Pace | None = None,
    ) -> None:
        self.engine = engine
        self.cfg = cfg
        self.senders = senders if senders is not None else senders_for(cfg)
        self.claim_limit = claim_limit
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self._now = now  # for quiet hours (tests); default: the database's clock
        self.pace = pace or Pace()

    def _claim(self, token: str) -> tuple[list[Row], datetime]:
        with self.engine.begin() as conn:
            rescued = conn.execute(_SQL["rescue_expired"], {"org": self.cfg.org}).all()
            if rescued:
                log.warning(
                    "org %s: %d notifications had an expired lease; claimable again",
                    self.cfg.org,
                    len(rescued),
                )
            rows = conn.execute(
                _SQL["claim"],
                {
                    "org": self.cfg.org,
                    "token": token,
                    "limit": self.claim_limit,
                    "lease_seconds": self.lease_seconds,
                },
            ).all()
            now = conn.execute(text("SELECT now()")).scalar_one()
        return [_row(r) for r in rows], (self._now() if self._now else now)

    def _contact(self, recipient: str) -> RepContact | None:
        n = self.cfg.notifications
        return n.contact(recipient) if n is not None and recipient != "admins" else None

    def run_once(self) -> NotifyStats:
        """One claim: send what it took, record every row. Returns what happened."""
        stats = NotifyStats()
        token = uuid.uuid4().hex
        rows, now = self._claim(token)
        if not rows:
            return stats
        stats.claimed = len(rows)
        by_id = {r.id: r for r in rows}

        def quiet(r: Row) -> bool:
            away = (r.away_from, r.away_until) if r.away_from and r.away_until else None
            return is_quiet(self.cfg, r.recipient, now, away)

        plan = plan_messages(self.cfg, rows, quiet)
        outcomes: dict[int, Outcome] = {i: held(RECHECK_SECONDS) for i in plan.held}
        stats.held = len(plan.held)
        blocked: dict[tuple[str, str], Outcome] = {}  # (channel, recipient or '*') -> why
        for msg in plan.messages:
            key = (msg.channel, msg.recipient)
            stop = blocked.get(key) or blocked.get((msg.channel, "*"))
            wait = self.pace.wait(key)
            if stop is None and wait > 0:
                stop = not_tried(wait, "waiting for the channel's pace")
            sender = self.senders.get(msg.channel)
            if stop is None and sender is None:
                stop = not_tried(60.0, f"no `{msg.channel}:` settings for this org")
            if stop is not None:
                for i in msg.row_ids:
                    outcomes[i] = stop
                continue
            assert sender is not None
            stats.messages += 1
            try:
                sender.send(msg, self._contact(msg.recipient))
            except SendError as exc:
                attempts = max(by_id[i].attempts for i in msg.row_ids)
                out = after_failure(exc, attempts)
                for i in msg.row_ids:
                    outcomes[i] = out
                self._log_failure(msg, exc, out)
                if isinstance(exc, RateLimited):
                    stats.rate_limited += 1
                    self.pace.hold(key, exc.retry_after)
                    blocked[key] = not_tried(out.delay, out.error or "")
                elif isinstance(exc, ChannelDown):
                    blocked[(msg.channel, "*")] = not_tried(out.delay, out.error or "")
                continue
            stats.accepted_at.append(time.time())
            if msg.channel == "slack" and self.pace.slack_interval_s > 0:
                self.pace.hold(key, self.pace.slack_interval_s)
            for i in msg.row_ids:
                outcomes[i] = sent(msg.dedupe_key)
        self._finish(token, outcomes, stats)
        return stats

    def _log_failure(self, msg: Message, exc: SendError, out: Outcome) -> None:
        # ids and codes only: no address, no lead field, no text
        level = (
            logging.ERROR
            if out.state == "dead"
            else logging.INFO
            if isinstance(exc, RateLimited)  # expected: the channel's pace
            else logging.WARNING
        )
        log.log(
            level,
            "org %s: %s %s notification rows %s: %s (%s)",
            self.cfg.org,
            msg.channel,
            "failed for good," if out.state == "dead" else "not sent yet,",
            list(msg.row_ids),
            exc.code,
            "dead" if out.state == "dead" else f"again in {out.delay:.0f} s",
        )

    def _finish(self, token: str, outcomes: dict[int, Outcome], stats: NotifyStats) -> None:
        ids = sorted(outcomes)
        o = [outcomes[i] for i in ids]
        with self.engine.begin() as conn:
            conn.execute(
                _SQL["finish"],
                {
                    "token": token,
                    "ids": ids,
                    "states": [x.state for x in o],
                    "errors": [x.error for x in o],
                    "delays": [float(x.delay) for x in o],
                    "refunds": [x.refund for x in o],
                    "sent_as": [x.sent_as for x in o],
                },
            )
        for x in o:
            if x.state == "sent":
                stats.sent += 1
            elif x.state == "dead":
                stats.dead += 1
            elif x.state == "pending":
                stats.retried += 1

    def drain(self, timeout: float = 60.0) -> NotifyStats:
        """Run until no row is ready now (held and delayed rows stay); for tests and --once."""
        total = NotifyStats()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.run_once()
            for name in ("claimed", "messages", "sent", "dead", "retried", "held", "rate_limited"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            total.accepted_at += s.accepted_at
            if not s.claimed:
                break
        return total

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                s = self.run_once()
            except Exception:
                log.exception("org %s: notification round failed; retrying", self.cfg.org)
                stop.wait(5.0)
                continue
            if s.claimed < self.claim_limit:
                stop.wait(self.poll_seconds)


def finished_rows(engine: Engine, org: str, state: str, limit: int = 100) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            _SQL["list_finished"], {"org": org, "state": state, "limit": limit}
        ).all()
    return [dict(r._mapping) for r in rows]


def retry_dead(engine: Engine, org: str, ids: list[int] | None = None) -> int:
    with engine.begin() as conn:
        return len(conn.execute(_SQL["retry_dead"], {"org": org, "ids": ids}).all())
