"""`connector sandbox`: a local Salesforce or HubSpot simulator to try the connector with no CRM
account. It is seeded with the demo's users (``demo_world``: one seeding, one config writer),
prints what a config needs (base URL, credentials, user ids) and can write a ready config."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from connector.core.errors import UsageError

if TYPE_CHECKING:  # the simulators are imported when the command runs (not by the CLI)
    from crm_sandboxes import HubSpotSandbox, SalesforceSandbox, SandboxServer

WRITTEN_BY = "connector sandbox"
ORG_NAMES = {"salesforce": "sandbox-sf", "hubspot": "sandbox-hs"}
SF_SECRETS = ("DEMO_SF_CLIENT_ID", "DEMO_SF_CLIENT_SECRET", "DEMO_SF_OUTBOUND_SECRET")
HS_SECRETS = ("DEMO_HS_TOKEN", "DEMO_HS_WEBHOOK_SECRET")


def _ids(label: str, rows: list[tuple[str, str]]) -> list[str]:
    lines = [f"  {label}"]
    lines += [f"    {uid:<20} {name}" for uid, name in rows]
    return lines


def salesforce_info(sf: SalesforceSandbox, reps: list[str], intake: str) -> list[str]:
    """What a Salesforce org's config needs from this simulator, and how to use it."""
    from connector.shell.demo_world import SF_INTAKE_NAME, SF_ORG_ID, SF_REP_NAMES

    url = sf.url
    seed = (
        '{"records": [{"object": "Lead", "owner_id": "' + intake + '", "fields": '
        '{"Country": "US"}}]}'
    )
    return [
        f"salesforce sandbox on {url} (in memory; Ctrl-C stops it)",
        f"  instance_url:     {url}",
        f"  OAuth client:     client_id {sf.client_id}, client_secret {sf.client_secret} "
        "(auth method client_credentials)",
        f"  login:            username {sf.username}, password {sf.password}, "
        f"security_token {sf.security_token} (auth method password)",
        f"  organization_id:  {SF_ORG_ID} (what its Outbound Messages carry)",
        *_ids(
            "intake user (owns new leads until they are routed: intake_owner_ids):",
            [(intake, SF_INTAKE_NAME)],
        ),
        *_ids("reps (users):", list(zip(reps, SF_REP_NAMES, strict=True))),
        "  add a lead:       curl -s -X POST "
        f"{url}/_sandbox/seed -H 'Content-Type: application/json' -d '{seed}'",
        f"  see a record:     curl -s {url}/_sandbox/records/RECORD_ID",
    ]


def hubspot_info(hs: HubSpotSandbox, owners: list[str]) -> list[str]:
    """What a HubSpot org's config needs from this simulator, and how to use it."""
    from connector.shell.demo_world import ENV, HS_OWNER_NAMES, HS_PORTAL

    url = hs.url
    seed = '{"records": [{"object": "contacts", "properties": {"country": "Canada"}}]}'
    return [
        f"hubspot sandbox on {url} (in memory; Ctrl-C stops it)",
        f"  base_url:         {url}",
        f"  access_token:     {hs.access_token} (private app)",
        f"  portal_id:        {HS_PORTAL} (what its webhook events carry)",
        f"  webhook secret:   {ENV['DEMO_HS_WEBHOOK_SECRET']} (the app's client secret; "
        "`connector send` signs with it)",
        "  contacts with no owner are the ones to route",
        *_ids("owners:", list(zip(owners, HS_OWNER_NAMES, strict=True))),
        "  add a contact:    curl -s -X POST "
        f"{url}/_sandbox/seed -H 'Content-Type: application/json' -d '{seed}'",
        f"  see a record:     curl -s {url}/_sandbox/records/RECORD_ID",
    ]


def write_config(path: Path, text: str) -> None:
    """Write the config; a file there is replaced only if this command wrote it."""
    if path.is_dir():
        raise UsageError(f"sandbox: --write-config {path}: is a folder; name a file")
    if path.exists():
        try:
            first = path.read_text(encoding="utf-8").partition("\n")[0]
        except (OSError, UnicodeDecodeError):
            first = ""
        if not first.startswith(f"# Written by `{WRITTEN_BY}`"):
            raise UsageError(
                f"sandbox: --write-config {path}: the file exists and was not written by "
                "this command; name a new file"
            )
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"sandbox: --write-config {path}: {exc.strerror or exc}") from None


def _wait_for_stop() -> None:
    """Until Ctrl-C (SIGINT) or SIGTERM. Both get a handler of their own: a process started
    with SIGINT ignored (by a shell's `&` without job control, say) inherits that, and
    Python then raises no KeyboardInterrupt on Ctrl-C."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass


def _seeded(sandbox: SandboxServer, org: str) -> tuple[list[str], str, list[str]]:
    """Seed the users; (what to print, the config, the ${ENV} names of its secrets)."""
    from connector.shell.demo_world import (
        hubspot_yaml,
        salesforce_yaml,
        seed_hubspot_owners,
        seed_salesforce_users,
    )
    from crm_sandboxes import HubSpotSandbox, SalesforceSandbox

    if isinstance(sandbox, SalesforceSandbox):
        reps, intake = seed_salesforce_users(sandbox)
        config = salesforce_yaml(
            sandbox, reps, intake, org=org, written_by=WRITTEN_BY, poll_interval_seconds=None
        )
        return salesforce_info(sandbox, reps, intake), config, list(SF_SECRETS)
    assert isinstance(sandbox, HubSpotSandbox)
    owners = seed_hubspot_owners(sandbox)
    config = hubspot_yaml(sandbox, owners, org=org, written_by=WRITTEN_BY, poll=True)
    return hubspot_info(sandbox, owners), config, list(HS_SECRETS)


def cmd_sandbox(args: argparse.Namespace) -> int:
    from connector.shell.demo_world import ENV
    from crm_sandboxes import make_sandbox

    target = Path(args.write_config) if args.write_config else None
    if target is not None and not target.parent.is_dir():
        raise UsageError(f"sandbox: --write-config {target}: no such folder {target.parent}")
    sandbox = make_sandbox(args.kind, hubspot_limit_per_10s=args.limit_per_10s)
    try:
        sandbox.start(args.host, args.port)
    except OSError as exc:
        raise UsageError(
            f"sandbox: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    try:
        org = ORG_NAMES[args.kind]
        lines, config, names = _seeded(sandbox, org)
        if target is not None:
            write_config(target, config)
            lines.append(
                f"config for org {org} written to {target}; its secrets, for the shell that "
                "runs the connector:"
            )
            lines += [f"export {name}={ENV[name]}" for name in names]
        else:
            lines.append("--write-config FILE writes a ready config for this sandbox")
        print("\n".join(lines), flush=True)
        _wait_for_stop()
    finally:
        sandbox.stop()
    return 0
