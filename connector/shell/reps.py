"""`connector rep away|back|list`: time off without a redeploy, stored in Postgres.

Every process reads ``rep_time_off`` in the statement that reads a team's seats, so a change
is seen at each process's next pick. The config stays the source of truth for who the reps
are: a rep is named by its crm_user_id or its name in the org's YAML.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

import db
from connector.core import limits
from connector.core.config import ConfigError, OrgConfig
from connector.core.crm_kinds import crm_kind
from connector.core.hours import parse_local_time
from connector.routing.rep_state import combined
from connector.shell.availability import rep_states

MAX_REASON = 200


@dataclass(frozen=True)
class Rep:
    crm_user_id: str
    name: str
    teams: tuple[str, ...]
    timezones: tuple[str, ...]  # the zones its local times are read in, one per team


def configured_reps(cfg: OrgConfig) -> list[Rep]:
    """Every rep of the org's config, once, in config order."""
    found: dict[str, tuple[str, list[str], list[str]]] = {}
    for team in cfg.teams:
        for m in team.members:
            _name, teams, zones = found.setdefault(m.crm_user_id, (m.name, [], []))
            teams.append(team.name)
            zones.append(team.rep_timezone(m))
    return [Rep(uid, n, tuple(t), tuple(z)) for uid, (n, t, z) in found.items()]


def resolve_rep(cfg: OrgConfig, who: str) -> Rep:
    """The rep named ``who`` (its crm_user_id in any form its CRM has, else its name,
    case-insensitive)."""
    reps = configured_reps(cfg)
    key = crm_kind(cfg.crm.kind).id_key(who.strip())
    for rep in reps:
        if rep.crm_user_id == key:
            return rep
    named = [r for r in reps if r.name.casefold() == who.strip().casefold()]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        ids = ", ".join(r.crm_user_id for r in named)
        raise ConfigError(f"org {cfg.org}: {who!r} names several reps ({ids}): give a crm_user_id")
    by_name = {r.name.casefold(): r.name for r in reps}
    close = difflib.get_close_matches(who.strip().casefold(), by_name, n=1, cutoff=0.75)
    if close:
        raise ConfigError(
            f"org {cfg.org}: no rep {who!r} in the config; did you mean {by_name[close[0]]!r}?"
        )
    raise ConfigError(
        f"org {cfg.org}: no rep {who!r} in the config (give a crm_user_id or a name; "
        "`connector rep list` shows them)"
    )


def parse_until(rep: Rep, value: str, now: datetime) -> datetime:
    """``--until``: ISO 8601; without an offset it is read in the rep's time zone."""
    has_offset = _has_offset(value)
    zones = sorted(set(rep.timezones))
    if not has_offset and len(zones) > 1:
        raise ConfigError(
            f"--until {value!r}: {rep.name} works in several time zones ({', '.join(zones)}); "
            "give the offset, e.g. 2026-12-24T09:00+01:00"
        )
    try:
        until = parse_local_time(value, zones[0]).astimezone(UTC)
    except ValueError as exc:
        raise ConfigError(f"--until: {exc}") from None
    except OverflowError:
        raise ConfigError(f"--until {value!r} is out of range") from None
    if until <= now:
        raise ConfigError(f"--until {value!r} is not in the future")
    if until - now > timedelta(days=limits.MAX_SPAN_DAYS):
        raise ConfigError(f"--until {value!r} is more than {limits.MAX_SPAN_DAYS} days away")
    return until


def _has_offset(value: str) -> bool:
    try:
        return datetime.fromisoformat(value.strip()).tzinfo is not None
    except ValueError:
        return False


def check_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if not reason.strip() or len(reason) > MAX_REASON or not reason.isprintable():
        raise ConfigError(f"--reason: must be 1 to {MAX_REASON} printable characters on one line")
    return reason.strip()


def set_away(
    engine: Engine, cfg: OrgConfig, rep: Rep, until: datetime, reason: str | None, now: datetime
) -> None:
    with engine.begin() as conn:
        # a config apply of the org first (it locks its teams in name order, then those it
        # retires), then the rep's teams (db/reps.sql touch_teams says why): every lead
        # assigned after this commits, waiting or not, sees the time off
        conn.execute(text(db.queries("teams")["lock_org"]), {"org": cfg.org})
        conn.execute(
            text(db.queries("reps")["touch_teams"]),
            {"org": cfg.org, "crm_user_id": rep.crm_user_id},
        ).all()
        conn.execute(
            text(db.queries("reps")["set_away"]),
            {
                "org": cfg.org,
                "crm_user_id": rep.crm_user_id,
                "starts_at": now,
                "until": until,
                "reason": reason,
            },
        )


def end_away(engine: Engine, cfg: OrgConfig, rep: Rep) -> bool:
    """Remove the rep's command-line time off; False when it had none."""
    with engine.begin() as conn:
        row = conn.execute(
            text(db.queries("reps")["end_away"]), {"org": cfg.org, "crm_user_id": rep.crm_user_id}
        ).one_or_none()
    return row is not None


def away_command(
    engine: Engine, cfg: OrgConfig, who: str, until: str | None, reason: str | None, now: datetime
) -> tuple[Rep, datetime]:
    """`connector rep away` and the dashboard's Away button: check the input (ConfigError
    with the one-line message when it is wrong; nothing stored), then store the time off."""
    rep = resolve_rep(cfg, who)
    if not until or not until.strip():
        raise ConfigError("rep away: --until is required (e.g. --until 2026-12-24T09:00)")
    when = parse_until(rep, until, now)
    set_away(engine, cfg, rep, when, check_reason(reason), now)
    return rep, when


def back_command(engine: Engine, cfg: OrgConfig, who: str) -> tuple[Rep, bool]:
    """`connector rep back` and the dashboard's Back button: (the rep, whether it had time
    off set from the command line, now removed)."""
    rep = resolve_rep(cfg, who)
    return rep, end_away(engine, cfg, rep)


def rep_rows(engine: Engine, cfg: OrgConfig, now: datetime) -> list[tuple[Rep, str]]:
    """Each configured rep with its state now in its teams, as one line (``rep_state``)."""
    by_team = rep_states(engine, cfg, now)
    rows = []
    for rep in configured_reps(cfg):
        states = [
            (team, r.state)
            for team in rep.teams
            for r in by_team.get(team, [])
            if r.crm_user_id == rep.crm_user_id
        ]
        rows.append((rep, combined(states) if states else "not applied yet: run migrate"))
    return rows
