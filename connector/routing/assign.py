"""Assignment: the one code path every input (webhook, poll, import) goes through.

``Router.assign_in(conn, leads, source)`` runs inside the caller's transaction, so a webhook
can acknowledge only after its commit. In that transaction it inserts the leads (unique per
org, object and CRM id: a repeat changes nothing and reports the existing owner), matches the
rules, locks each team row it routes to (teams in name order, so two batches never deadlock),
reads the active seats with a fresh snapshot, picks owners with the rotation in
``connector.routing.rotation``, and records the assignments, the members' counts and one outbox row
per assignment in a single statement. A lead whose rule says ``route_to: account_owner`` goes
to its account's owner when ``connector.routing.accounts`` finds one (that is not a turn of
any rotation: no count moves), else on to the rule's team rotation. For Salesforce orgs a
lead's id (and its parent's) is stored in the 18-character form, so a record sent by its
15-character id and later by its 18-character id (in any case) is one lead. The team row
lock is what serialises a team's rotation across any number of processes; it is held only
for two statements and the commit, and never while a CRM is called.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.exc import DBAPIError

import db
from connector.core.config import OrgConfig
from connector.routing import accounts
from connector.routing.rotation import Seat, next_owners
from connector.routing.rules import Match, compile_rules, match
from crm_adapters.salesforce_ids import id_key

log = logging.getLogger(__name__)

SOURCES = ("salesforce_outbound", "hubspot_webhook", "poll", "import", "api")
MAX_ID_LENGTH = 64
MAX_FIELDS_BYTES = 64 * 1024
RECONNECT_ATTEMPTS = 3

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("routing").items()}

Status = Literal["assigned", "duplicate", "unassigned"]


class LeadError(ValueError):
    """A lead that cannot be stored; ``reason`` is short and safe to log (no field values)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Lead:
    crm_id: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Outcome:
    crm_id: str
    status: Status
    team: str | None = None
    owner_id: str | None = None
    owner_name: str | None = None
    reason: str | None = None
    account_id: str | None = None  # set when the lead went to this account's owner


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def validate_lead(crm_id: object, fields: object) -> Lead:
    """Check one lead's shape before anything is stored; raise LeadError saying why not."""
    if isinstance(crm_id, int) and not isinstance(crm_id, bool):
        crm_id = str(crm_id)
    if not isinstance(crm_id, str) or not crm_id.strip():
        raise LeadError("missing CRM id")
    crm_id = crm_id.strip()
    if len(crm_id) > MAX_ID_LENGTH:
        raise LeadError(f"CRM id longer than {MAX_ID_LENGTH} characters")
    if not crm_id.isprintable():
        raise LeadError("CRM id contains control characters")
    if not isinstance(fields, Mapping):
        raise LeadError("fields must be an object")
    if not all(isinstance(k, str) and k for k in fields):
        raise LeadError("field names must be non-empty text")
    if _has_nul(fields):
        raise LeadError("a field contains a NUL character")
    try:  # NaN and Infinity are not JSON: Postgres' jsonb refuses them
        encoded = json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError):
        raise LeadError("fields must be JSON values") from None
    if len(encoded) > MAX_FIELDS_BYTES:
        raise LeadError(f"fields larger than {MAX_FIELDS_BYTES} bytes")
    return Lead(crm_id, dict(fields))


class RoutingError(RuntimeError):
    """The routing state does not match the config (e.g. a team was never applied)."""


class Router:
    """Assigns one org's leads; safe to share between threads (it holds no connection)."""

    def __init__(self, engine: Engine, cfg: OrgConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self.rules = compile_rules(cfg.rules)
        self.parent_key = cfg.crm.parent_key
        # One record, one lead: Salesforce ids are stored in their 18-character form.
        self.salesforce_ids = cfg.crm.kind == "salesforce"

    def stored_crm_id(self, value: str) -> str:
        """The stored form of a CRM id: 18-character for well-formed Salesforce ids."""
        return id_key(value) if self.salesforce_ids else value

    def assign(self, lead: Lead, source: str) -> Outcome:
        """Store and assign one lead in its own short transaction."""
        return self.assign_many([lead], source)[0]

    def assign_many(self, leads: Sequence[Lead], source: str) -> list[Outcome]:
        """Store and assign a batch in one transaction, with the same guarantees.

        A connection lost mid-transaction (server restart, network) is retried on a fresh
        connection. That is safe even when the commit's fate is unknown: a lead that did get
        stored comes back as a duplicate with its owner, never with a second one.
        """
        if not leads:
            return []
        for attempt in range(RECONNECT_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    return self.assign_in(conn, leads, source)
            except DBAPIError as exc:
                if not exc.connection_invalidated or attempt == RECONNECT_ATTEMPTS - 1:
                    raise
                log.warning("database connection lost; retrying (attempt %d)", attempt + 2)
        raise AssertionError("unreachable")

    def assign_in(self, conn: Connection, leads: Sequence[Lead], source: str) -> list[Outcome]:
        """Assign ``leads`` inside the caller's open transaction; outcomes in input order."""
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        org, obj = self.cfg.org, self.cfg.crm_object
        keys = [self.stored_crm_id(lead.crm_id) for lead in leads]
        first: dict[str, Lead] = {}
        for key, lead in zip(keys, leads, strict=True):
            first.setdefault(key, lead)
        unique = list(first.items())
        rows = conn.execute(
            _SQL["insert_leads"],
            {
                "org": org,
                "crm_object": obj,
                "source": source,
                "crm_ids": [cid for cid, _ in unique],
                "fields": [json.dumps(x.fields) for _, x in unique],
                "parent_ids": [self._parent(x) for _, x in unique],
            },
        ).all()
        new_ids = {r.crm_id: r.id for r in rows}
        results: dict[str, Outcome] = {}

        old = [cid for cid in first if cid not in new_ids]
        if old:
            for r in conn.execute(
                _SQL["existing_leads"], {"org": org, "crm_object": obj, "crm_ids": old}
            ):
                results[r.crm_id] = Outcome(
                    r.crm_id,
                    "duplicate",
                    r.team,
                    r.crm_user_id,
                    r.owner_name,
                    None if r.crm_user_id else r.unassigned_reason,
                )

        by_team: dict[str, list[tuple[int, str, Match]]] = defaultdict(list)
        unassigned: dict[str, list[int]] = defaultdict(list)
        picked: list[tuple[int, str, Match]] = []
        for cid in first:  # input order: the earliest lead gets the next rep
            if cid not in new_ids:
                continue
            lead_id = new_ids[cid]
            m = match(self.rules, first[cid].fields)
            if m is None:
                unassigned["no_rule_matched"].append(lead_id)
                results[cid] = Outcome(cid, "unassigned", reason="no_rule_matched")
            else:
                picked.append((lead_id, cid, m))
        matched, fallbacks = self._match_accounts(conn, picked, first, results)
        for lead_id, cid, m in picked:
            if cid not in results:  # not given to its account's owner: the team's rotation
                by_team[m.team].append((lead_id, cid, m))

        # Teams in name order. A team that only receives account-matched leads is not locked
        # FOR UPDATE (its rotation does not move; the insert's foreign key check takes FOR KEY
        # SHARE on it), one that also rotates records them under its lock: one order for both.
        for team_name in sorted(set(by_team) | set(matched)):
            group = by_team.get(team_name, [])
            if not group:
                accounts.record_matched(conn, self.cfg, source, matched[team_name])
                continue
            team = conn.execute(_SQL["lock_team"], {"org": org, "name": team_name}).one_or_none()
            if team is None:
                raise RoutingError(
                    f"team {team_name!r} of org {org!r} is not in the database: "
                    "run `connector migrate` with this config"
                )
            accounts.record_matched(conn, self.cfg, source, matched.get(team_name, []))
            seats = conn.execute(_SQL["active_seats"], {"team_id": team.id}).all()
            if not seats:
                for lead_id, cid, _ in group:
                    unassigned["no_active_member"].append(lead_id)
                    results[cid] = Outcome(cid, "unassigned", team_name, reason="no_active_member")
                continue
            picks = next_owners(
                [Seat(s.id, s.weight, s.assigned_in_epoch, s.position) for s in seats],
                sum(s.assigned_in_epoch for s in seats),
                len(group),
            )
            seat_by_id = {s.id: s for s in seats}
            conn.execute(
                _SQL["record_assignments"],
                {
                    "org": org,
                    "team_id": team.id,
                    "epoch": team.epoch,
                    "source": source,
                    "lead_ids": [g[0] for g in group],
                    "member_ids": picks,
                    "rule_indexes": [g[2].rule_index for g in group],
                    "rule_names": [g[2].rule_name for g in group],
                },
            )
            for (_, cid, _m), member_id in zip(group, picks, strict=True):
                s = seat_by_id[member_id]
                results[cid] = Outcome(cid, "assigned", team_name, s.crm_user_id, s.name)

        for reason, ids in unassigned.items():
            conn.execute(_SQL["mark_unassigned"], {"reason": reason, "lead_ids": ids})
        accounts.note_fallbacks(conn, fallbacks)

        out: list[Outcome] = []
        seen: set[str] = set()
        for key in keys:
            o = results[key]
            if key in seen:  # a repeat inside the same batch (perhaps by its other id form)
                o = Outcome(o.crm_id, "duplicate", o.team, o.owner_id, o.owner_name, o.reason)
            seen.add(key)
            out.append(o)
        return out

    def _match_accounts(
        self,
        conn: Connection,
        picked: Sequence[tuple[int, str, Match]],
        leads: Mapping[str, Lead],
        results: dict[str, Outcome],
    ) -> tuple[dict[str, list[accounts.Matched]], dict[int, accounts.AccountDecision]]:
        """Leads of ``route_to: account_owner`` rules that go to their account's owner, by the
        team of the owner's seat (their outcomes set in ``results``), and the decisions of
        those that fall back to their rule's team rotation, by lead id."""
        candidates = [
            accounts.Candidate(
                lead_id,
                cid,
                leads[cid].fields,
                self._parent(leads[cid]),
                m.team,
                m.rule_index,
                m.rule_name,
            )
            for lead_id, cid, m in picked
            if self.cfg.rules[m.rule_index].route_to == "account_owner"
        ]
        found, fallbacks = accounts.match_accounts(conn, self.cfg, candidates)
        matched: dict[str, list[accounts.Matched]] = defaultdict(list)
        for hit in found:
            c, seat = hit.candidate, hit.seat
            matched[seat.team].append(hit)
            results[c.crm_id] = Outcome(
                c.crm_id,
                "assigned",
                seat.team,
                seat.crm_user_id,
                seat.name,
                account_id=hit.decision.account_id,
            )
        return dict(matched), fallbacks

    def _parent(self, lead: Lead) -> str | None:
        if not self.parent_key:
            return None
        value = lead.fields.get(self.parent_key)
        return self.stored_crm_id(str(value)) if value not in (None, "") else None
