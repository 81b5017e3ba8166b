"""The report of a what-if replay: recorded against proposed owners per team and rep, the
unassigned and their reasons, as JSON (``report``), a table (``format_report``) and an SVG
bar chart (``plot_svg``, ``write_plot``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from connector.core.charts import Bar, bar_chart, standalone
from connector.core.config import OrgConfig
from connector.routing.replay_history import History
from connector.routing.simulate import Simulation


def _share(n: int, total: int) -> float:
    return round(n / total, 4) if total else 0.0


@dataclass
class _Tally:
    """Before (recorded) and after (proposed) counts for the report."""

    teams: Counter[tuple[str, str]] = field(default_factory=Counter)
    reps: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    why: Counter[tuple[str, str]] = field(default_factory=Counter)
    extra: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(
        self,
        side: str,
        team: str | None,
        owner: str | None,
        reason: str | None,
        overflowed: bool,
        by_account: bool,
    ) -> None:
        if owner is not None and team is not None:
            self.teams[(side, team)] += 1
            self.reps[(side, team, owner)] += 1
        else:
            self.why[(side, reason or "unassigned")] += 1
        self.extra[(side, "overflowed")] += overflowed
        self.extra[(side, "account_matched")] += by_account and owner is not None

    def by(self, side: str) -> dict[str, int]:
        return dict(sorted((k, n) for (s, k), n in self.why.items() if s == side and n))

    def pair(self, key: str) -> dict[str, int]:
        return {"before": self.extra[("before", key)], "after": self.extra[("after", key)]}


def report(new: OrgConfig, history: History, sim: Simulation, since: datetime) -> dict[str, Any]:
    """The JSON shape of `connector simulate --json` (documented in the README)."""
    names = dict(history.names)
    names.update({m.crm_user_id: m.name for t in new.teams for m in t.members})
    total = len(sim.outcomes)
    tally = _Tally()
    changed_team = changed_rep = 0
    unassigned: list[dict[str, str | None]] = []
    for o in sim.outcomes:
        lead = o.lead
        tally.add(
            "before", lead.team, lead.owner, lead.reason, bool(lead.overflowed), lead.by_account
        )
        tally.add("after", o.team, o.owner, o.reason, bool(o.overflowed), o.by_account)
        if o.owner is None:
            unassigned.append(
                {"crm_id": lead.crm_id, "reason": o.reason or "unassigned", "team": o.team}
            )
        old_team = lead.team if lead.owner is not None else None
        changed_team += old_team != (o.team if o.owner is not None else None)
        changed_rep += lead.owner != o.owner
    teams = sorted({t for _, t in tally.teams} | {t.name for t in new.teams})
    reps = sorted({(t, uid) for _, t, uid in tally.reps})
    return {
        "org": new.org,
        "since": since.isoformat(),
        "leads": total,
        "changed_team": changed_team,
        "changed_team_share": _share(changed_team, total),
        "changed_rep": changed_rep,
        "changed_rep_share": _share(changed_rep, total),
        "teams": [
            {"name": t, "before": tally.teams[("before", t)], "after": tally.teams[("after", t)]}
            for t in teams
        ],
        "reps": [
            {
                "team": t,
                "crm_user_id": uid,
                "name": names.get(uid, uid),
                "before": tally.reps[("before", t, uid)],
                "after": tally.reps[("after", t, uid)],
            }
            for t, uid in reps
        ],
        "unassigned": {
            "before": tally.by("before"),
            "after": tally.by("after"),
            "leads": unassigned,
        },
        "overflowed": tally.pair("overflowed"),
        "account_matched": tally.pair("account_matched"),
        "judged_at_arrival": sim.judged_at_arrival,
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
    lines.append("")
    for key, label in (
        ("overflowed", "passed on to an overflow team"),
        ("account_matched", "given to their account's owner"),
    ):
        pair = rep[key]
        lines.append(f"{label}: before {pair['before']}, after {pair['after']}")
    un = rep["unassigned"]
    lines.append(f"unassigned before: {un['before'] or 'none'}; after: {un['after'] or 'none'}")
    for item in un["leads"][:max_leads]:
        where = f" (team {item['team']})" if item.get("team") else ""
        lines.append(f"  {item['crm_id']}: {item['reason']}{where}")
    if len(un["leads"]) > max_leads:
        lines.append(f"  ... and {len(un['leads']) - max_leads} more (--json lists them all)")
    lines += _notes(rep)
    return "\n".join(lines)


def _notes(rep: Mapping[str, Any]) -> list[str]:
    lines = []
    if rep.get("judged_at_arrival"):
        lines.append(
            f"note: {rep['judged_at_arrival']} leads were routed before decisions recorded the "
            "instant availability was judged at: they are replayed one by one at their arrival"
        )
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
    return lines


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
