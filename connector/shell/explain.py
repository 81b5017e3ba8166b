"""`connector explain`: why a lead has the owner it has, from what was recorded at the time.

``load_explanation`` reads (one connection, read-only) the lead, the pushes that named it,
earlier skips, the routing decisions recorded when they were made, the current owner, the
earlier owners and every owner write. ``build_explanation`` turns those rows into one plain,
JSON-ready dict (pure) and ``format_explanation`` renders it as text (pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

import db
from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind
from connector.routing.decisions import expand, member_ids


class NotFound(LookupError):
    """The org has no live lead with this CRM id."""


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _row(row: Mapping[Any, Any]) -> dict[str, Any]:
    return {k: _plain(v) for k, v in row.items()}


def build_explanation(
    org: str,
    lead: Mapping[Any, Any],
    events: Sequence[Mapping[Any, Any]],
    skips: Sequence[Mapping[Any, Any]],
    decisions: Sequence[Mapping[Any, Any]],
    current: Mapping[Any, Any] | None,
    history: Sequence[Mapping[Any, Any]],
    writes: Sequence[Mapping[Any, Any]],
    who: Mapping[int, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The explanation as plain data (the `--json` output); ``who`` names the members of
    compactly recorded picks (member id -> (CRM user id, name))."""
    who = who or {}
    return {
        "org": org,
        "crm_id": lead["crm_id"],
        "crm_object": lead["crm_object"],
        "lead_id": lead["id"],
        "arrival": {
            "source": lead["source"],
            "received_at": _plain(lead["received_at"]),
            "events": [
                {
                    "event_key": e["event_key"],
                    "source": e["source"],
                    "state": e["state"],
                    "note": e["last_error"],
                    "attempts": e["attempts"],
                    "received_at": _plain(e["received_at"]),
                    "finished_at": _plain(e["finished_at"]),
                }
                for e in events
            ],
            "skipped": [_row(s) for s in skips],
        },
        "decisions": [
            {"kind": d["kind"], "made_at": _plain(d["made_at"]), **expand(d["detail"], who)}
            for d in decisions
        ],
        "owner": _row(current) if current else None,
        "unassigned_reason": lead["unassigned_reason"] if current is None else None,
        "history": [_row(h) for h in history],
        "writes": [_row(w) for w in writes],
    }


def _rep(d: Mapping[str, Any]) -> str:
    return f"{d.get('name')} ({d.get('crm_user_id')})"


def describe_check(c: Mapping[str, Any]) -> str:
    """One recorded condition as text: ``Country in ca|us``, ``Employees gte 1000``,
    ``any of (...)``, ``territory na (row rows[3])``."""
    if "territory" in c:
        row = f" (row {c['row']})" if c.get("row") else ""
        return f"territory {c['territory']}{row}"
    if "group" in c:
        inner = "; ".join(describe_check(k) for k in c["checks"])
        return f"not ({inner})" if c["group"] == "not" else f"{c['group']} of ({inner})"
    if "allowed" in c:
        return f"{c['field']} in {'|'.join(c['allowed'])}"
    args = c.get("args") or []
    shown = "|".join(str(a) for a in args)
    if c["op"] == "between" and len(args) == 2:
        shown = f"{args[0]} and {args[1]}"
    kind = f" ({c['type']})" if c.get("type") else ""
    return f"{c['field']}{kind} {c['op']}" + (f" {shown}" if shown else "")


def _fields_in(c: Mapping[str, Any]) -> list[str]:
    if "field" in c:
        return [c["field"]]
    return [f for k in c.get("checks", []) for f in _fields_in(k)]


def _has(values: Mapping[str, Any] | None, name: str) -> str:
    if values is None:
        return "value purged by retention"
    if values.get(name) is None:
        return "lead has no value"
    return f"lead has {values[name]!r}"


def rule_line(rule: Mapping[str, Any], values: Mapping[str, Any] | None) -> str:
    """One rule of a decision's trace: matched (by what), or the conditions that failed
    with the lead's values (shared by explain and the dashboard)."""
    if "not_listed" in rule:
        return f"  {rule['not_listed']} more rules did not match (not listed)"
    team = rule["team"] if rule["team"] is not None else "of its territory"
    head = f'  rule {rule["index"]} "{rule["name"]}" -> team {team}: '
    if rule["matched"]:
        why = ", ".join(describe_check(c) for c in rule["checks"])
        return head + "matched" + (f" ({why})" if why else " (default rule)")
    misses = []
    for c in rule["checks"]:
        if c["ok"]:
            continue
        if "allowed" in c:
            misses.append(
                f"{c['field']}: wanted {'|'.join(c['allowed'])}, {_has(values, c['field'])}"
            )
        elif "territory" in c:
            misses.append(f"{describe_check(c)}: no row covers the lead")
        else:
            names = list(dict.fromkeys(_fields_in(c)))
            has = ", ".join(
                _has(values, n) if len(names) == 1 else f"{n}: {_has(values, n)}" for n in names
            )
            misses.append(f"{describe_check(c)}: {has}")
    return head + "no match (" + "; ".join(misses) + ")"


def _candidates(d: Mapping[str, Any]) -> list[str]:
    lines = []
    for c in d.get("candidates", []):
        state = "eligible" if c["skip"] is None else f"skipped ({c['skip']})"
        lines.append(f"    - {_rep(c)}, weight {c['weight']}, count {c['count']}: {state}")
    return lines


def _chosen(ch: Mapping[str, Any]) -> str:
    return (
        f"  chosen: {_rep(ch)}: count {ch['count_before']} -> {ch['count_before'] + 1}, "
        f"weighted share {ch['share_before']:.2f} -> {ch['share_after']:.2f} "
        f"(weight {ch['weight']} of {ch['total_weight']}; the team had handed out "
        f"{ch['team_total_before']} leads this epoch)"
    )


def _judged_lines(d: Mapping[str, Any]) -> list[str]:
    """When the router judged caps, hours and time off, and who was away by the command."""
    lines = []
    if d.get("at"):
        lines.append(f"  caps, hours and time off judged at {d['at']}")
    if d.get("away_by_command"):
        lines.append("  away by `connector rep away`: " + ", ".join(d["away_by_command"]))
    return lines


def _decision_lines(n: int, d: Mapping[str, Any]) -> list[str]:
    kind = d["kind"]
    lines = []
    if kind == "route":
        lines.append(f"decision {n}: routed at {d['made_at']} (arrived by {d.get('source')})")
        lines.extend(_judged_lines(d))
        values = d.get("values")
        for rule in d.get("rules", []):
            lines.append(rule_line(rule, values))
        if not d.get("rules"):
            lines.append("  no rule tried")
        if "account" in d:
            acct = d["account"]
            lines.append("  account: " + ", ".join(f"{k} {v}" for k, v in acct.items()))
    elif kind == "reassign":
        note = f', note "{d["note"]}"' if d.get("note") else ""
        lines.append(
            f"decision {n}: reassigned at {d['made_at']}: {d.get('reason')} "
            f"(--{d.get('mode')}) from {_rep(d.get('from', {}))}{note}"
        )
    else:
        outcome = d.get("outcome")
        extra = ""
        if outcome == "owner_changed":
            extra = f": a person set owner {d.get('found_owner')}; not taken"
        elif outcome == "met":
            extra = f": {d.get('status_field')} moved on from its initial status"
        elif d.get("why"):
            extra = f": {d['why']}"
        lines.append(f"decision {n}: SLA check at {d['made_at']}: {outcome}{extra}")
        return lines
    if d.get("team") is not None:
        lines.append(f"  team {d['team']}" + (f" (epoch {d['epoch']})" if "epoch" in d else ""))
    cands = _candidates(d)
    if cands:
        lines.append("  candidates:")
        lines.extend(cands)
    if d.get("chosen"):
        lines.append(_chosen(d["chosen"]))
    if d.get("outcome") == "unassigned":
        lines.append(f"  unassigned: {d.get('reason')}")
    if d.get("sla_minutes"):
        lines.append(f"  SLA: checked {d['sla_minutes']} minutes after the assignment")
    if kind == "reassign":
        replaces = ", ".join(d.get("replaces_owners") or []) or "an intake owner only"
        lines.append(
            f"  superseded {d.get('superseded_writes', 0)} unsent write(s); new write "
            f"{d.get('outbox_id')} may replace {replaces}"
        )
    return lines


def format_explanation(e: Mapping[str, Any]) -> str:
    """The explanation as text, one fact a line (pure)."""
    arr = e["arrival"]
    lines = [
        f"lead {e['crm_id']} ({e['crm_object']}, org {e['org']})",
        f"arrived: by {arr['source']} at {arr['received_at']}",
    ]
    for ev in arr["events"]:
        note = f": {ev['note']}" if ev["note"] else ""
        repeat = " (a repeat: nothing new was decided)" if ev["note"] == "already routed" else ""
        lines.append(
            f"  push {ev['source']} event {ev['event_key']} received {ev['received_at']}, "
            f"{ev['state']}{note}{repeat}"
        )
    for s in arr["skipped"]:
        owner = f" (owner {s['owner_found']})" if s["owner_found"] else ""
        lines.append(
            f"  skipped before: {s['reason']}{owner} via {s['source']}, {s['times']} time(s)"
        )
    if not e["decisions"]:
        lines.append("no routing decision recorded")
    for n, d in enumerate(e["decisions"], 1):
        lines.extend(_decision_lines(n, d))
    owner = e["owner"]
    if owner:
        sla = f", SLA check due {owner['sla_due_at']}" if owner.get("sla_due_at") else ""
        lines.append(
            f"owner now: {_rep(owner)} in team {owner['team']} since {owner['assigned_at']} "
            f"({owner['reason']}){sla}"
        )
    else:
        lines.append(f"owner now: none ({e['unassigned_reason'] or 'unassigned'})")
    if e["history"]:
        lines.append("earlier owners:")
        for h in e["history"]:
            lines.append(
                f"  - {_rep(h)} in team {h['team']} from {h['assigned_at']} ({h['reason']}) "
                f"until {h['ended_at']} ({h['ended_reason']})"
            )
    lines.append("write-back:" if e["writes"] else "write-back: none")
    for w in e["writes"]:
        found = f", found owner {w['found_owner']}" if w["found_owner"] else ""
        err = f": {w['last_error']}" if w["last_error"] else ""
        rep = f" (may replace {', '.join(w['replaces_owners'])})" if w["replaces_owners"] else ""
        lines.append(
            f"  - write {w['id']}: owner {w['owner_id']}{rep}: {w['state']} after "
            f"{w['attempts']} attempt(s){found}{err}"
        )
    return "\n".join(lines)


def load_explanation(engine: Engine, cfg: OrgConfig, crm_id: str) -> dict[str, Any]:
    """Read everything recorded about one lead; NotFound when the org has no such lead."""
    q = {k: text(v) for k, v in db.queries("explain").items()}
    kind = crm_kind(cfg.crm.kind)
    key = kind.id_key(crm_id.strip())
    params = {"org": cfg.org, "crm_object": cfg.crm_object, "crm_id": key}
    with engine.connect() as conn:
        lead = conn.execute(q["lead"], params).mappings().one_or_none()
        if lead is None:
            raise NotFound(f"lead {key} is not known to org {cfg.org!r}")
        lid = {"lead_id": lead["id"]}
        decisions = conn.execute(q["decisions"], lid).mappings().all()
        ids = sorted({i for d in decisions for i in member_ids(d["detail"])})
        who = {r.id: (r.crm_user_id, r.name) for r in conn.execute(q["members"], {"ids": ids})}
        return build_explanation(
            cfg.org,
            lead,
            conn.execute(q["events"], {**params, "salesforce": kind.id_forms}).mappings().all(),
            conn.execute(q["skips"], params).mappings().all(),
            decisions,
            conn.execute(q["current"], lid).mappings().one_or_none(),
            conn.execute(q["history"], lid).mappings().all(),
            conn.execute(q["writes"], lid).mappings().all(),
            who,
        )
