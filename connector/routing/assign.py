"""Assignment: the one router every input (webhook, poll, import, API) goes through.

``Router.assign`` stores and routes one lead in its own transaction; ``assign_in`` (and
``assign_in_deferred``, which lets a caller build the outcomes after its commit) does it for a
batch inside the caller's transaction, so a webhook is acknowledged only after its commit.

Every rotation pick, for one lead or a batch, is made on the server by ``route_team``
(db/migrations; ``connector.routing.calls`` computes what the config decides first) and
recorded by ``record_assignments``: the team row's lock serialises the team's rotation across
any number of processes, and it is held for that one call plus the commit, never while a CRM
is called. A single new lead of a rotation rule whose team has no overflow team is one call of
``route_new_lead`` (its insert and ``route_team``), sent in autocommit by ``assign``: one round
trip. Any other lead goes through the batch's plan (``connector.routing.batch``): insert,
rules, account owners, then one ``route_team`` call a team, in overflow order.

A lead's stored id is unique per org, object and CRM id: a repeat changes nothing and reports
the existing owner. For Salesforce orgs a lead's id (and its parent's) is stored in the
18-character form, so a record sent by its 15-character id and later by its 18-character id
(in any case) is one lead. The instant caps, hours and time off are judged at is read once per
call, before the team's lock, from the router's clock; every decision records it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind
from connector.core.database import one_statement
from connector.core.errors import DatabaseUnavailable
from connector.routing import accounts, batch
from connector.routing.calls import TeamInputs, TraceCache, lead_params, team_inputs
from connector.routing.decisions import DecisionRecorder
from connector.routing.leads import (
    SOURCES,
    Lead,
    LeadError,
    Outcome,
    RoutingError,
    assigned_outcome,
    validate_lead,
)
from connector.routing.rules import Tally, Unparsed, match, org_rules

__all__ = ["SOURCES", "Lead", "LeadError", "Outcome", "Router", "RoutingError", "validate_lead"]

log = logging.getLogger(__name__)

RECONNECT_ATTEMPTS = 3

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("routing").items()}
# the single-lead call as the driver takes it (Router.assign sends it without SQLAlchemy)
_ROUTE_LEAD = db.pyformat(db.queries("routing")["route_new_lead"])


class Router:
    """Assigns one org's leads; safe to share between threads (it holds no connection)."""

    def __init__(
        self,
        engine: Engine,
        cfg: OrgConfig,
        clock: Callable[[], datetime] | None = None,
        unparsed: Unparsed | None = None,
    ) -> None:
        self.engine = engine
        self.cfg = cfg
        # The time the caps, working hours and time off are judged at (tests inject one).
        self.clock = clock or (lambda: datetime.now(UTC))
        self.rules = org_rules(cfg)
        # where field values that did not parse as their condition's type are counted
        self.unparsed: Unparsed = unparsed if unparsed is not None else Tally()
        self.parent_key = cfg.crm.parent_key
        # One record, one lead: ids are stored in their CRM's one form (Salesforce: 18).
        self.id_key = crm_kind(cfg.crm.kind).id_key
        self.teams: dict[str, TeamInputs] = {t.name: team_inputs(t) for t in cfg.teams}
        self.traces = TraceCache(self.rules)

    def stored_crm_id(self, value: str) -> str:
        """The stored form of a CRM id: 18-character for well-formed Salesforce ids."""
        return self.id_key(value)

    def assign(self, lead: Lead, source: str) -> Outcome:
        """Store and assign one lead in its own short transaction: a lead of a rotation rule
        is one call in autocommit (the call is the transaction: one round trip, the team row
        locked for that statement only); any other goes through ``assign_many``.

        A connection lost mid-call is retried on a fresh connection: a lead that did get
        stored comes back as a duplicate with its owner, never with a second one.
        """
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        params = self._single_params(lead, source)
        if params is None:
            return self.assign_many([lead], source)[0]
        for attempt in range(RECONNECT_ATTEMPTS):
            try:
                return self._single_outcome(one_statement(self.engine, _ROUTE_LEAD, params), params)
            except DatabaseUnavailable as exc:
                if not exc.connection_invalidated or attempt == RECONNECT_ATTEMPTS - 1:
                    raise
                log.warning("database connection lost; retrying (attempt %d)", attempt + 2)
        raise AssertionError("unreachable")

    def _single_params(self, lead: Lead, source: str) -> dict[str, Any] | None:
        """The ``route_new_lead`` call for a lead that can take it (a rotation rule matched and
        its team has no overflow team), else None: the batch's plan decides it."""
        now = self.clock()
        m = match(self.rules, lead.fields, now, self.unparsed)
        if m is None or self.cfg.rules[m.rule_index].route_to != "team":
            return None
        inputs = self.teams.get(m.team)
        if inputs is None or inputs.overflow_team is not None:
            return None
        key = (self.stored_crm_id(lead.crm_id), lead.fields, self._parent(lead))
        return lead_params(self.cfg, self.traces, inputs, key, m, source, now)

    def _single_outcome(self, row: Sequence[Any] | None, params: Mapping[str, Any]) -> Outcome:
        """The outcome a ``route_new_lead`` row says."""
        if row is None:
            raise AssertionError("route_new_lead returned no row")
        status, _, team, owner_id, owner_name, reason, picks, ids, skips = row
        cid = params["crm_id"]
        if status == "no_team":
            raise RoutingError(
                f"team {params['team']!r} of org {self.cfg.org!r} is not in the database: "
                "run `connector migrate` with this config"
            )
        if status == "duplicate":
            return Outcome(cid, "duplicate", team, owner_id, owner_name, reason)
        candidates = tuple(zip(ids, skips, strict=True))
        if picks[0] is None:
            return Outcome(cid, "unassigned", team, reason=reason, candidates=candidates)
        return assigned_outcome(cid, team, owner_id, owner_name, candidates)

    def assign_many(self, leads: Sequence[Lead], source: str) -> list[Outcome]:
        """Store and assign a batch in one transaction, with the same guarantees (and the
        same retry of a lost connection as ``assign``)."""
        if not leads:
            return []
        for attempt in range(RECONNECT_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    outcomes = self.assign_in_deferred(conn, leads, source)
                return outcomes()  # after the commit: the team's lock is no longer held
            except DatabaseUnavailable as exc:
                if not exc.connection_invalidated or attempt == RECONNECT_ATTEMPTS - 1:
                    raise
                log.warning("database connection lost; retrying (attempt %d)", attempt + 2)
        raise AssertionError("unreachable")

    def assign_in(self, conn: Connection, leads: Sequence[Lead], source: str) -> list[Outcome]:
        """Assign ``leads`` inside the caller's open transaction; outcomes in input order."""
        return self.assign_in_deferred(conn, leads, source)()

    def assign_in_deferred(
        self, conn: Connection, leads: Sequence[Lead], source: str
    ) -> Callable[[], list[Outcome]]:
        """``assign_in``, returning what builds the outcomes: a caller that needs them only
        after its commit (``assign_many``, the inbox, the poller, an import) builds them then,
        without the teams' locks. It reads nothing from the database.

        The teams' locks are held until the caller commits: a caller writes its own rows in
        that transaction before it calls this where they are more than a row or two (the
        inbox's events and skips, an import's skips), and commits right after it."""
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        if not leads:
            return lambda: []
        if len(leads) == 1:
            params = self._single_params(leads[0], source)
            if params is not None:
                single = self._single_outcome(
                    tuple(conn.execute(_SQL["route_new_lead"], params).one()), params
                )
                return lambda: [single]
        keys = [self.stored_crm_id(lead.crm_id) for lead in leads]
        first: dict[str, Lead] = {}
        for key, lead in zip(keys, leads, strict=True):
            first.setdefault(key, lead)
        b = batch.Batch(conn, self.cfg, source, DecisionRecorder(self.cfg, self.rules))
        b.parents = {cid: self._parent(lead) for cid, lead in first.items()}
        now = self.clock()  # the batch's instant: rules with relative dates match by it too
        new_ids = batch.insert(b, first)
        picked = batch.match_rules(b, self.rules, first, new_ids, now, self.unparsed)
        matched, fallbacks = batch.match_accounts(b, picked, first)
        for lead_id, cid, m in picked:
            if cid not in b.results:  # not given to its account's owner: the rotation
                b.by_team[m.team].append((lead_id, cid, m))
        if new_ids:
            b.first = min(new_ids.values())
            b.recorder.judged_at(list(new_ids.values()), now, b.first)
        batch.route(b, self.teams, matched, now)
        if b.no_rule:
            conn.execute(
                _SQL["mark_unassigned"], {"reason": "no_rule_matched", "lead_ids": b.no_rule}
            )
        accounts.note_fallbacks(conn, fallbacks)
        b.recorder.flush(conn)  # the other decisions, in the same transaction
        missing = [k for k in keys if k not in b.results and k not in b.picked]
        if missing:  # raised here, so the caller's transaction rolls back, not after it
            raise RoutingError(f"{len(missing)} leads of the batch got no outcome")
        return lambda: b.in_input_order(keys)

    def _parent(self, lead: Lead) -> str | None:
        if not self.parent_key:
            return None
        value = lead.fields.get(self.parent_key)
        return self.stored_crm_id(str(value)) if value not in (None, "") else None
