"""`connector reassign --to REP` when REP cannot take a lead now (away, off shift, capped):
refused in one line, exit 2, nothing moved, unless `--force`. Real Postgres, the Salesforce
sandbox, the CLI in-process."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from connector.routing.reassign import ReassignError, reassign_lead
from connector.shell.cli import main
from crm_sandboxes import SalesforceSandbox
from tests.helpers.reassign_orgs import (
    ReOrg,
    counts,
    current_owner,
    route,
    table_counts,
    write_config,
)

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _two_days_on() -> tuple[str, datetime]:
    """A day that is not today nor tomorrow (UTC), and its next 09:00 UTC."""
    day = datetime.now(UTC).date() + timedelta(days=2)
    return DAYS[day.weekday()], datetime.combine(day, time(9), UTC)


def _grace(org: ReOrg, extra: str) -> str:
    """The org's YAML with ``extra`` added to Grace's member entry."""
    old = f'{{crm_user_id: "{org.user["Grace"]}", name: Grace}}'
    assert old in org.yaml
    return org.yaml.replace(old, f'{{crm_user_id: "{org.user["Grace"]}", name: Grace, {extra}}}')


def _refusal(org: ReOrg, lead: str, state: str) -> str:
    return (
        f"connector: lead {lead}: rep Grace ({org.user['Grace']}) is {state} in team na; "
        "--force gives it the lead anyway; nothing changed\n"
    )


def _utc(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC")


@pytest.mark.parametrize("why", ["away", "off_shift", "capped"])
def test_reassign_to_an_unavailable_rep_is_refused_and_nothing_moves(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    why: str,
) -> None:
    org = ReOrg(sf, engine)
    leads = route(engine, org, ["US", "US"])
    yaml_text = org.yaml
    tomorrow = datetime.combine(datetime.now(UTC).date() + timedelta(days=1), time(0), UTC)
    if why == "off_shift":
        day, opens = _two_days_on()
        yaml_text = _grace(org, f'hours: {{timezone: UTC, {day}: "09:00-10:00"}}')
        state = f"off shift until {_utc(opens)}"
    elif why == "capped":
        yaml_text = _grace(org, "caps: {per_day: 0}")
        state = f"capped until {_utc(tomorrow)} (0 of 0 leads today)"
    write_config(tmp_path, org, yaml_text, db_url, monkeypatch)
    if why == "away":
        assert main(["rep", "away", "Grace", "--until", "2099-01-01T00:00", "--reason", "PTO"]) == 0
        state = "away until 2099-01-01 00:00 UTC (PTO, command line)"
    capsys.readouterr()
    owners = [current_owner(engine, lead) for lead in leads]
    assert "Grace" not in owners
    before, rotation = table_counts(engine), counts(engine)

    code = main(["reassign", "--org", "acme", "--to", "Grace", *leads])
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", _refusal(org, leads[0], state))
    assert table_counts(engine) == before and counts(engine) == rotation
    assert [current_owner(engine, lead) for lead in leads] == owners

    # --force gives them anyway
    code = main(["reassign", "--org", "acme", "--to", "Grace", "--force", *leads])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert [current_owner(engine, lead) for lead in leads] == ["Grace", "Grace"]
    assert counts(engine)["Grace"] == rotation["Grace"] + 2


def test_the_move_itself_checks_under_the_lock(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The check before any lead moves reads without a lock; the move reads the rep again
    under the team's lock: a rep set away in between is refused there too."""
    org = ReOrg(sf, engine)
    (lead,) = route(engine, org, ["US"])
    write_config(tmp_path, org, org.yaml, db_url, monkeypatch)
    assert main(["rep", "away", "Grace", "--until", "2099-01-01T00:00"]) == 0
    before, owner = table_counts(engine), current_owner(engine, lead)
    with pytest.raises(ReassignError) as refused:
        reassign_lead(engine, org.cfg, lead, to="Grace", reason="reassigned")
    assert (
        str(refused.value)
        == _refusal(org, lead, "away until 2099-01-01 00:00 UTC (command line)")[
            len("connector: ") : -1
        ]
    )
    assert table_counts(engine) == before and current_owner(engine, lead) == owner
    moved = reassign_lead(engine, org.cfg, lead, to="Grace", reason="reassigned", force=True)
    assert moved.new_name == "Grace" and current_owner(engine, lead) == "Grace"


def test_reassign_to_an_available_rep_still_works(
    engine: Engine,
    db_url: str,
    sf: SalesforceSandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    org = ReOrg(sf, engine)
    (lead,) = route(engine, org, ["US"])
    # Grace works today (every day, all day): available
    write_config(
        tmp_path,
        org,
        _grace(org, 'hours: {timezone: UTC, mon-sun: "00:00-24:00"}'),
        db_url,
        monkeypatch,
    )
    assert main(["reassign", "--org", "acme", "--to", "Grace", lead]) == 0
    assert current_owner(engine, lead) == "Grace"
