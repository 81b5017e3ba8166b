"""The scheduled sync: read what changed in the CRM since the watermark and route it.

One poller per org at a time, however many connector processes run: the poll holds a
session-level advisory lock, taken with pg_try_advisory_lock, so a second process skips the
round instead of waiting, and a poller that dies releases the lock with its connection. The
lock's connection is idle during CRM calls (no transaction is open), so it blocks nothing
else. Each page is assigned and the watermark advanced in the same transaction, so the
watermark never passes a record that was not committed. Every poll starts
``overlap_seconds`` before the watermark; the unique lead key makes the re-reads no-ops.

Under the same lock, each round then checks the leads whose SLA time has come
(``check_sla``): it reads them back from the CRM (batched, no transaction open) and re-routes
once those still with the owner we assigned and still in their initial status.
An org with ``route_to: account_owner`` rules first refreshes its account mirror
(connector/intake/accounts_sync.py) in the same round, so the round's leads see it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.ownership import intake_keys, is_unrouted, owner_key
from connector.intake.accounts_sync import AccountSyncResult, refresh_accounts
from connector.intake.verify import routing_fields
from connector.routing.assign import Lead, LeadError, Router, validate_lead
from connector.routing.reassign import ReassignError, reassign_lead
from connector.routing.rules import Unparsed
from connector.routing.sla import sla_verdict
from crm_adapters.base import AccountSource, CrmAdapter, CrmRecord

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("poll").items()}
_REASSIGN: dict[str, TextClause] = {k: text(v) for k, v in db.queries("reassign").items()}
SLA_BATCH = 200


@dataclass
class PollResult:
    ran: bool
    pages: int = 0
    seen: int = 0
    skipped_owned: int = 0
    rejected: int = 0
    new: int = 0
    duplicate: int = 0
    watermark: datetime | None = None
    sla_rerouted: int = 0
    sla_closed: int = 0  # checks that ended without a re-route (met, moved, gone)
    accounts: AccountSyncResult | None = None


def routable(cfg: OrgConfig, record: CrmRecord, owner_field: str, intake: frozenset[str]) -> bool:
    """Whether the poller may route this record: unowned, or owned by an intake owner (a
    record a person owns is not a candidate, and is not recorded as a skip either: the poll
    reads every changed record, not only the ones someone asked us to route)."""
    return is_unrouted(cfg.crm.kind, record.fields.get(owner_field), intake)


def poll_window(
    watermark: datetime | None, now: datetime, overlap_s: int, lookback_s: int
) -> datetime:
    """Where this poll starts reading (pure)."""
    if watermark is None:
        return now - timedelta(seconds=lookback_s)
    return watermark - timedelta(seconds=overlap_s)


class Poller:
    def __init__(
        self,
        engine: Engine,
        cfg: OrgConfig,
        adapter: CrmAdapter,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        unparsed: Unparsed | None = None,
    ) -> None:
        self.engine = engine
        self.cfg = cfg
        self.adapter = adapter
        self.router = Router(engine, cfg, unparsed=unparsed)
        self.clock = clock
        self.intake = intake_keys(cfg)

    def poll_once(self) -> PollResult:
        """One round, unless another process is polling this org right now."""
        org = self.cfg.org
        with self.engine.connect() as lock_conn:
            got = lock_conn.execute(_SQL["try_lock"], {"org": org}).scalar_one()
            lock_conn.commit()  # end the implicit transaction: the lock is session-level
            if not got:
                log.info("org %s: another process is polling; skipping this round", org)
                return PollResult(ran=False)
            try:
                result = self._poll()
                result.sla_rerouted, result.sla_closed = self.check_sla()
                return result
            finally:
                lock_conn.execute(_SQL["unlock"], {"org": org})
                lock_conn.commit()

    def _poll(self) -> PollResult:
        org = self.cfg.org
        with self.engine.connect() as conn:
            watermark = conn.execute(_SQL["watermark"], {"org": org}).scalar_one_or_none()
        since = poll_window(
            watermark,
            self.clock(),
            self.cfg.poll.overlap_seconds,
            self.cfg.poll.initial_lookback_seconds,
        )
        result = PollResult(ran=True, watermark=watermark)
        if self.cfg.account_matching:
            if isinstance(self.adapter, AccountSource):
                result.accounts = refresh_accounts(self.engine, self.cfg, self.adapter)
            else:
                log.warning("org %s: this adapter cannot read accounts; mirror not refreshed", org)
        for page in self.adapter.changed_since(since):
            result.pages += 1
            result.seen += len(page)
            leads: list[Lead] = []
            for record in page:
                if not routable(self.cfg, record, self.adapter.owner_field, self.intake):
                    result.skipped_owned += 1
                    continue
                fields = routing_fields(record, self.cfg.read_fields, self.adapter.owner_field)
                try:
                    leads.append(validate_lead(record.crm_id, fields))
                except LeadError as exc:
                    result.rejected += 1
                    log.warning(
                        "org %s: record %s not routable: %s", org, record.crm_id, exc.reason
                    )
            page_max = max(r.modified_at for r in page)
            with self.engine.begin() as conn:
                routed = self.router.assign_in_deferred(conn, leads, "poll")
                conn.execute(_SQL["advance"], {"org": org, "watermark": page_max})
            outcomes = routed()  # after the commit, without the teams' locks
            result.new += sum(1 for o in outcomes if o.status != "duplicate")
            result.duplicate += sum(1 for o in outcomes if o.status == "duplicate")
            result.watermark = max(result.watermark or page_max, page_max)
        if result.pages == 0 and watermark is None:
            # nothing changed yet: remember where we looked, so the next poll does not
            # look back the full initial window again
            with self.engine.begin() as conn:
                conn.execute(_SQL["advance"], {"org": org, "watermark": since})
        log.info(
            "org %s: poll read %d records in %d pages: %d new, %d repeats, %d owned",
            org,
            result.seen,
            result.pages,
            result.new,
            result.duplicate,
            result.skipped_owned,
        )
        return result

    def check_sla(self, now: datetime | None = None) -> tuple[int, int]:
        """Decide the leads whose SLA time has come: (re-routed, closed without re-route).

        Called under the poll lock. Each lead is re-routed in its own transaction, and only
        if it still has the owner the CRM was checked against (a concurrent reassignment
        wins). A lead waiting for our owner write keeps its check for the next round.
        """
        if not any(t.sla for t in self.cfg.teams) and not any(r.sla for r in self.cfg.rules):
            return 0, 0
        org, kind = self.cfg.org, self.cfg.crm.kind
        with self.engine.connect() as conn:
            due = conn.execute(
                _REASSIGN["sla_due"],
                {"org": org, "now": now or self.clock(), "limit": SLA_BATCH},
            ).all()
        slas = {r.id: self.cfg.sla_for(r.rule_index, r.team) for r in due}
        fields = sorted({s.status_field for s in slas.values() if s})
        wanted = [r.crm_id for r in due if slas[r.id]]
        records = self.adapter.fetch_records(wanted, fields) if wanted else []
        by_id = {owner_key(kind, r.crm_id): r for r in records}
        rerouted = 0
        closed: list[tuple[int, str, dict[str, object]]] = []
        for r in due:
            sla = slas[r.id]
            if sla is None:  # the config no longer has an SLA for it
                closed.append((r.id, r.crm_user_id, {"outcome": "no_sla"}))
                continue
            record = by_id.get(owner_key(kind, r.crm_id))
            verdict = sla_verdict(
                record,
                self.adapter.owner_field,
                r.crm_user_id,
                sla,
                kind,
                self.intake,
                r.write_open,
            )
            detail: dict[str, object] = {
                "outcome": verdict,
                "minutes": sla.minutes,
                "status_field": sla.status_field,
                "owner": r.crm_user_id,
                "values": {sla.status_field: record.fields.get(sla.status_field)} if record else {},
            }
            if verdict == "wait":
                continue
            if verdict == "expired":
                try:
                    reassign_lead(
                        self.engine,
                        self.cfg,
                        r.crm_id,
                        reason="sla_expired",
                        expect_owner=r.crm_user_id,
                    )
                    rerouted += 1
                    continue
                except ReassignError as exc:
                    detail = {**detail, "outcome": "not_rerouted", "why": str(exc)}
            if verdict == "owner_changed" and record is not None:
                detail["found_owner"] = record.fields.get(self.adapter.owner_field)
            closed.append((r.id, r.crm_user_id, detail))
        if closed:
            with self.engine.begin() as conn:
                conn.execute(
                    _REASSIGN["sla_done"],
                    {
                        "org": org,
                        "ids": [c[0] for c in closed],
                        "owners": [c[1] for c in closed],
                        "details": [json.dumps(c[2]) for c in closed],
                    },
                )
        if rerouted or closed:
            log.info("org %s: SLA checks: %d re-routed, %d closed", org, rerouted, len(closed))
        return rerouted, len(closed)
