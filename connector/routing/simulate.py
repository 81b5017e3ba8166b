"""What-if replay: the stored leads of a window, routed again through a proposed config.

``connector simulate --org ORG --config NEW.yaml --since 30d`` reads the org's leads received in
the window (their fields are the CRM's, as read back when they arrived) and what happened to
them, then routes them again in memory with the new rules, teams and weights. Nothing is
written: the reads run in one READ ONLY transaction and the replay is a pure function.

Order and starting state are what make a replay with the config that actually ran give back
exactly the recorded assignments:

- Leads are replayed in arrival order, except that each team's assigned leads keep the order
  in which the team's lock handed them out (assignment id order), because that is the order
  the rotation saw them in.
- A team whose rotation (members in order, weights, active flags) is unchanged continues from
  the counts its members had in the epoch at the start of the window. A team whose rotation
  changed starts from zero counts, as applying the new config would start a new epoch. A team
  whose epoch changed during the window cannot be reproduced exactly: it is reported.

The fairness guarantee of the replay is the rotation's own (``connector.routing.rotation``):
within each team and each epoch every active rep stays strictly within one lead of its weighted
share after every assignment.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

import db
from connector.core.charts import Bar, bar_chart, standalone
from connector.core.config import OrgConfig
from connector.routing.rotation import Seat, next_owners
from connector.routing.rules import compile_rules, match
from connector.routing.teams import rotation_fingerprint

_SQL = db.queries("simulate")
PICK_CHUNK = 256


@dataclass(frozen=True)
class HistoryLead:
    """One stored lead and what the connector did with it."""

    lead_id: int
    crm_id: str
    fields: Mapping[str, Any]
    received_at: datetime
    team: str | None = None
    owner: str | None = None
    reason: str | None = None
    assignment_id: int | None = None
    epoch: int | None = None
    # reassigned since it was routed: ``team``/``owner`` are routing's pick, ``current_team``
    # the team of its owner now
    reassigned: bool = False
    current_team: str | None = None


@dataclass(frozen=True)
class TeamRotation:
    """A team's rotation as the database has it now."""

    epoch: int
    fingerprint: str


@dataclass(frozen=True)
class History:
    leads: list[HistoryLead]
    rotations: dict[str, TeamRotation]
    # team -> epoch -> crm_user_id -> leads received before the window
    counts_before: dict[str, dict[int, dict[str, int]]]
    # crm_user_id -> the name the database knows (reps no longer in the config)
    names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Replayed:
    lead: HistoryLead
    team: str | None
    owner: str | None
    reason: str | None


@dataclass
class Simulation:
    outcomes: list[Replayed]
    # team -> "continued" (same rotation, counts carried over) | "restarted" (changed rotation)
    rotations: dict[str, str] = field(default_factory=dict)
    # teams whose epoch changed inside the window: their recorded order cannot be reproduced
    restarted_in_window: list[str] = field(default_factory=list)
    # teams that gave or got a reassigned lead of the window: reassignments move rotation counts
    # that the replay (routing only) does not repeat
    reassigned_in_window: list[str] = field(default_factory=list)


def replay_order(leads: Sequence[HistoryLead]) -> list[HistoryLead]:
    """Arrival order, with each team's assigned leads in the order its lock handed them out."""
    ordered = sorted(leads, key=lambda x: (x.received_at, x.lead_id))
    slots: dict[str, list[int]] = defaultdict(list)
    for i, lead in enumerate(ordered):
        if lead.assignment_id is not None and lead.team is not None:
            slots[lead.team].append(i)
    out = list(ordered)
    for positions in slots.values():
        by_lock = sorted((ordered[i] for i in positions), key=lambda x: x.assignment_id or 0)
        for i, lead in zip(positions, by_lock, strict=True):
            out[i] = lead
    return out


def _start_epochs(history: History) -> dict[str, tuple[int, bool]]:
    """Per team: the epoch it was in when the window began, and whether it changed inside."""
    seen: dict[str, set[int]] = defaultdict(set)
    for lead in history.leads:
        if lead.team is not None and lead.epoch is not None:
            seen[lead.team].add(lead.epoch)
    out: dict[str, tuple[int, bool]] = {}
    for team, rot in history.rotations.items():
        epochs = seen.get(team, set())
        first = min(epochs) if epochs else rot.epoch
        out[team] = (first, bool(epochs) and (len(epochs) > 1 or first != rot.epoch))
    return out


def simulate(cfg: OrgConfig, history: History) -> Simulation:
    """Route ``history``'s leads again with ``cfg``; pure (no I/O)."""
    rules = compile_rules(cfg.rules)
    epochs = _start_epochs(history)
    result = Simulation(outcomes=[])
    seats: dict[str, list[tuple[str, int]]] = {}
    counts: dict[str, list[int]] = {}
    for team in cfg.teams:
        active = [(m.crm_user_id, m.weight) for m in team.members if m.active]
        seats[team.name] = active
        rot = history.rotations.get(team.name)
        if rot is not None and rot.fingerprint == rotation_fingerprint(team):
            epoch, changed = epochs[team.name]
            before = history.counts_before.get(team.name, {}).get(epoch, {})
            counts[team.name] = [before.get(uid, 0) for uid, _ in active]
            result.rotations[team.name] = "continued"
            if changed:
                result.restarted_in_window.append(team.name)
        else:
            counts[team.name] = [0] * len(active)
            result.rotations[team.name] = "restarted"

    result.reassigned_in_window = sorted(
        {t for x in history.leads if x.reassigned for t in (x.team, x.current_team) if t}
    )
    upcoming: dict[str, list[int]] = {name: [] for name in seats}
    for lead in replay_order(history.leads):
        m = match(rules, lead.fields)
        if m is None:
            result.outcomes.append(Replayed(lead, None, None, "no_rule_matched"))
            continue
        team_seats = seats[m.team]
        if not team_seats:
            result.outcomes.append(Replayed(lead, m.team, None, "no_active_member"))
            continue
        queue = upcoming[m.team]
        if not queue:  # the rotation's next picks depend only on the counts: take them in chunks
            c = counts[m.team]
            rota = [Seat(i, w, c[i], i) for i, (_, w) in enumerate(team_seats)]
            queue.extend(reversed(next_owners(rota, sum(c), PICK_CHUNK)))
            for i in queue:
                c[i] += 1
        pick = queue.pop()
        result.outcomes.append(Replayed(lead, m.team, team_seats[pick][0], None))
    return result


def load_history(engine: Engine, cfg: OrgConfig, since: datetime) -> History:
    """Read the window in one READ ONLY transaction (the replay never writes)."""
    params = {"org": cfg.org, "since": since}
    with engine.connect() as conn, conn.begin():
        conn.execute(text("SET TRANSACTION READ ONLY"))
        rows = conn.execute(text(_SQL["history"]), params).all()
        team_rows = conn.execute(text(_SQL["teams"]), params).all()
        count_rows = conn.execute(text(_SQL["counts_before"]), params).all()
    leads = [
        HistoryLead(
            r.lead_id,
            r.crm_id,
            r.fields if isinstance(r.fields, dict) else json.loads(r.fields),
            r.received_at,
            r.team,
            r.owner,
            r.unassigned_reason if r.assignment_id is None else None,
            r.assignment_id,
            r.epoch,
            bool(r.reassigned),
            r.current_team,
        )
        for r in rows
    ]
    rotations = {r.team: TeamRotation(r.epoch, r.fingerprint) for r in team_rows}
    names = {r.crm_user_id: r.name for r in team_rows}
    before: dict[str, dict[int, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for r in count_rows:
        before[r.team][r.epoch][r.crm_user_id] = r.n
    return History(leads, rotations, {t: dict(e) for t, e in before.items()}, names)


def _share(n: int, total: int) -> float:
    return round(n / total, 4) if total else 0.0


def report(new: OrgConfig, history: History, sim: Simulation, since: datetime) -> dict[str, Any]:
    """The JSON shape of `connector simulate --json` (documented in the README)."""
    names = dict(history.names)
    names.update({m.crm_user_id: m.name for t in new.teams for m in t.members})
    total = len(sim.outcomes)
    team_before: Counter[str] = Counter()
    team_after: Counter[str] = Counter()
    rep_before: Counter[tuple[str, str]] = Counter()
    rep_after: Counter[tuple[str, str]] = Counter()
    why_before: Counter[str] = Counter()
    why_after: Counter[str] = Counter()
    changed_team = changed_rep = 0
    unassigned: list[dict[str, str]] = []
    for o in sim.outcomes:
        lead = o.lead
        if lead.owner is not None and lead.team is not None:
            team_before[lead.team] += 1
            rep_before[(lead.team, lead.owner)] += 1
        else:
            why_before[lead.reason or "unassigned"] += 1
        if o.owner is not None and o.team is not None:
            team_after[o.team] += 1
            rep_after[(o.team, o.owner)] += 1
        else:
            why_after[o.reason or "unassigned"] += 1
            unassigned.append({"crm_id": lead.crm_id, "reason": o.reason or "unassigned"})
        old_team = lead.team if lead.owner is not None else None
        changed_team += old_team != (o.team if o.owner is not None else None)
        changed_rep += lead.owner != o.owner
    teams = sorted(set(team_before) | set(team_after) | {t.name for t in new.teams})
    reps = sorted(set(rep_before) | set(rep_after))
    return {
        "org": new.org,
        "since": since.isoformat(),
        "leads": total,
        "changed_team": changed_team,
        "changed_team_share": _share(changed_team, total),
        "changed_rep": changed_rep,
        "changed_rep_share": _share(changed_rep, total),
        "teams": [{"name": t, "before": team_before[t], "after": team_after[t]} for t in teams],
        "reps": [
            {
                "team": t,
                "crm_user_id": uid,
                "name": names.get(uid, uid),
                "before": rep_before[(t, uid)],
                "after": rep_after[(t, uid)],
            }
            for t, uid in reps
        ],
        "unassigned": {
            "before": dict(sorted(why_before.items())),
            "after": dict(sorted(why_after.items())),
            "leads": unassigned,
        },
        "rotations": dict(sorted(sim.rotations.items())),
        "restarted_in_window": sorted(sim.restarted_in_window),
        "reassigned_in_window": sim.reassigned_in_window,
    }


def format_report(rep: Mapping[str, Any], max_leads: int = 20) -> str:
    """The human-readable table printed by `connector simulate`."""
    lines = [
        f"org {rep['org']}: {rep['leads']} leads since {rep['since']}",
        f"changed team: {rep['changed_team']} ({rep['changed_team_share']:.1%}), "
        f"changed rep: {rep['changed_rep']} ({rep['changed_rep_share']:.1%})",
        "",
        f"{'team':<24}{'before':>8}{'after':>8}{'diff':>8}",
    ]
    for t in rep["teams"]:
        lines.append(
            f"{t['name']:<24}{t['before']:>8}{t['after']:>8}{t['after'] - t['before']:>+8}"
        )
    lines += ["", f"{'team / rep':<40}{'before':>8}{'after':>8}{'diff':>8}"]
    for r in rep["reps"]:
        label = f"{r['team']} / {r['name']}"[:39]
        lines.append(f"{label:<40}{r['before']:>8}{r['after']:>8}{r['after'] - r['before']:>+8}")
    un = rep["unassigned"]
    lines += ["", f"unassigned before: {un['before'] or 'none'}; after: {un['after'] or 'none'}"]
    for item in un["leads"][:max_leads]:
        lines.append(f"  {item['crm_id']}: {item['reason']}")
    if len(un["leads"]) > max_leads:
        lines.append(f"  ... and {len(un['leads']) - max_leads} more (--json lists them all)")
    for team in rep.get("reassigned_in_window", []):
        lines.append(
            f"note: team {team} had leads of the window reassigned; recorded counts are "
            "routing's picks, and the replay does not repeat the reassignments' count changes"
        )
    for team in rep["restarted_in_window"]:
        lines.append(
            f"note: team {team}'s rotation changed inside the window; its replay starts from "
            "the counts at the window's start, so it may differ from what was recorded"
        )
    return "\n".join(lines)


def plot_svg(rep: Mapping[str, Any]) -> str:
    """Leads per rep under the proposed config (bars), each with its recorded count as the
    marker, for `connector simulate --plot FILE.svg`."""
    bars = [
        Bar(f"{r['team']} / {r['name']}", float(r["after"]), float(r["before"]))
        for r in rep["reps"]
    ]
    return standalone(
        bar_chart(
            bars,
            title=f"org {rep['org']}: leads per rep since {rep['since'][:10]}, "
            "proposed (bars) vs recorded (markers)",
            ident="simulate",
            width=720,
            reference_label="recorded",
        )
    )


def write_plot(rep: Mapping[str, Any], path: Path) -> None:
    path.write_text(plot_svg(rep), encoding="utf-8")
