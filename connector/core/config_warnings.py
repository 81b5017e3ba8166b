"""Settings that are valid but almost certainly not what the operator wants: each warning
names its key path, what it causes and what to write (``connector check-config`` prints them
with the file and line)."""

from __future__ import annotations

from connector.core.config import (
    MAX_IN_A_ROW,
    ConfigWarning,
    HubSpotCrm,
    OrgConfig,
    SalesforceCrm,
    Team,
)


def warnings(cfg: OrgConfig) -> list[ConfigWarning]:
    out: list[ConfigWarning] = []
    if isinstance(cfg.crm, SalesforceCrm):
        out += _salesforce(cfg, cfg.crm)
    elif isinstance(cfg.crm, HubSpotCrm) and not cfg.crm.webhook_secrets:
        out.append(
            ConfigWarning(
                ("crm", "webhook_secrets"),
                "empty: HubSpot webhooks are refused; add the app's client secret as "
                '`webhook_secrets: ["${ENV_NAME}"]` to receive them',
            )
        )
    for i, team in enumerate(cfg.teams):
        out += _catch_up(i, team)
    if cfg.notifications is not None:
        reps = [m.crm_user_id for t in cfg.teams for m in t.members]
        out += [ConfigWarning(loc, text) for loc, text in cfg.notifications.warnings(reps)]
    for tname, territory in cfg.territories.items():
        gaps = territory.table.gaps
        if gaps:
            more = f" and {len(gaps) - 1} more" if len(gaps) > 1 else ""
            out.append(
                ConfigWarning(
                    ("territories", tname),
                    f"{len(gaps)} gap(s) between postal ranges, first {gaps[0]}{more}: leads "
                    "there fall to the state's or country's row, else to the next rule",
                )
            )
    if cfg.account_matching and not cfg.poll.enabled:
        out.append(
            ConfigWarning(
                ("poll", "enabled"),
                "false: the account mirror is refreshed by the poll, so route_to: "
                "account_owner only sees accounts synced before it was turned off",
            )
        )
    return out


def _salesforce(cfg: OrgConfig, crm: SalesforceCrm) -> list[ConfigWarning]:
    out: list[ConfigWarning] = []
    if not cfg.intake_owner_ids:
        out.append(
            ConfigWarning(
                ("intake_owner_ids",),
                "empty: every Salesforce record has an owner, so nothing will be routed; "
                "list the intake queue or integration user",
            )
        )
    if not crm.outbound_secrets:
        out.append(
            ConfigWarning(
                ("crm", "outbound_secrets"),
                "empty: Outbound Messages are refused; add "
                '`outbound_secrets: ["${ENV_NAME}"]` to receive them',
            )
        )
    elif crm.organization_id is None:
        # Fails closed (the receiver answers 403): nothing unsafe, but no push arrives.
        out.append(
            ConfigWarning(
                ("crm", "organization_id"),
                "not set: every Outbound Message is refused (403 "
                "organization_id_not_configured); add the Salesforce.com Organization ID "
                "from Setup > Company Information (00D...)",
            )
        )
    return out


def _catch_up(index: int, team: Team) -> list[ConfigWarning]:
    """A `max_in_a_row` that cannot do what it is for, for some member's weight."""
    out: list[ConfigWarning] = []
    k = team.max_in_a_row
    total = sum(m.weight for m in team.members if m.active)
    loc = ("teams", index, "catch_up", "max_in_a_row")
    for m in team.members:
        # K leads in a row then one other pays K - (K+1) * share of a debt
        if k is None or not m.active or k * total > (k + 1) * m.weight:
            continue
        if total == m.weight:
            out.append(
                ConfigWarning(
                    ("teams", index, "catch_up"),
                    f"has no effect in team {team.name}: {m.name} is its only active member; "
                    "write `catch_up: none`",
                )
            )
        elif k * total == (k + 1) * m.weight:
            out.append(
                ConfigWarning(
                    loc,
                    f"{k} is too low for {m.name} of team {team.name} (weight {m.weight} of "
                    f"{total}): back from time away, the rep can never catch up; "
                    f"set max_in_a_row to at least {k + 1}",
                )
            )
        else:  # more than K of every K+1 leads: K would hold it below its share
            need = m.weight // (total - m.weight) + 1
            fix = (
                f"set max_in_a_row to at least {need} to limit it"
                if need <= MAX_IN_A_ROW
                else "no max_in_a_row up to 1000 can limit it"
            )
            out.append(
                ConfigWarning(
                    loc,
                    f"{k} does not apply to {m.name} of team {team.name} (weight {m.weight} "
                    f"of {total} is more than {k} of every {k + 1} leads): back from time "
                    f"away it catches up without a limit on leads in a row; {fix}",
                )
            )
    return out
