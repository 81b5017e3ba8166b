"""The handlers of the `connector` subcommands: ``connector.shell.cli`` parses the command
line and calls one, which takes the parsed arguments and returns the exit code."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from connector.core.config import ConfigError, OrgConfig
from connector.core.config_loading import (
    all_orgs,
    config_path_from,
    load_configs,
    load_sources,
    pick_org,
)
from connector.core.crm_kinds import crm_kind
from connector.core.errors import UsageError
from connector.shell.store import open_database, resolve_database_url, warn_if_vacuum_off
from connector.shell.tables import table
from crm_adapters.base import CrmError

log = logging.getLogger("connector")

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 3
EXIT_DB_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: the database could not be reached


def _configs(args: argparse.Namespace) -> dict[str, OrgConfig]:
    return load_configs(config_path_from(args.config))


def cmd_migrate(args: argparse.Namespace) -> int:
    from connector.routing.teams import apply_teams
    from connector.shell.migrations import migrate
    from connector.shell.store import database_url, make_engine

    configs = (
        list(all_orgs(_configs(args)))
        if (args.config or os.environ.get("CONNECTOR_CONFIG"))
        else []
    )
    engine = make_engine(database_url(configs))
    applied = migrate(engine)
    print(f"migrations applied: {applied or 'none (up to date)'}")
    for cfg in configs:
        changes = apply_teams(engine, cfg)
        restarted = [c.team for c in changes if c.epoch_restarted]
        print(
            f"org {cfg.org}: {len(cfg.teams)} teams applied"
            + (f"; new rotation epoch for {', '.join(restarted)}" if restarted else "")
        )
        if args.reroute:
            from connector.routing.reassign import reroute_inactive

            moved, left = reroute_inactive(engine, cfg)
            _print_moves(cfg.org, moved, left)
    return EXIT_OK


def _print_moves(org: str, moved: Sequence[Any], left: Sequence[tuple[str, str]]) -> None:
    for m in moved:
        print(f"org {org}: lead {m.crm_id}: {m.old_owner} -> {m.new_owner} ({m.reason})")
    for crm_id, why in left:
        print(f"org {org}: lead {crm_id} not re-routed: {why}", file=sys.stderr)
    print(f"org {org}: {len(moved)} leads re-routed, {len(left)} left")


def cmd_reassign(args: argparse.Namespace) -> int:
    from connector.routing.reassign import ReassignError, check_reassign_args, reassign_lead

    cfg = pick_org(_configs(args), args.org)
    engine = open_database([cfg])
    check_reassign_args(engine, cfg, args.crm_ids, args.to, args.reason, args.force)
    refused = 0
    for crm_id in args.crm_ids:
        try:
            m = reassign_lead(
                engine,
                cfg,
                crm_id,
                to=args.to,
                reason="reassigned" if args.to else "rotated",
                note=args.reason,
                force=args.force,
            )
        except ReassignError as exc:
            refused += 1
            print(f"connector: {exc}", file=sys.stderr)
            continue
        replaced = f", {m.superseded} unsent write superseded" if m.superseded else ""
        print(
            f"lead {m.crm_id}: {m.old_owner} -> {m.new_owner} ({m.new_name}, team {m.team})"
            f"{replaced}"
        )
    return EXIT_REJECTED if refused else EXIT_OK


def _rep_deactivate(args: argparse.Namespace, cfg: OrgConfig) -> int:
    from connector.routing.reassign import deactivate_rep

    engine = open_database([cfg])
    d = deactivate_rep(engine, cfg, args.rep, args.reroute)
    print(
        f"org {cfg.org}: rep {d.rep} inactive in {', '.join(d.teams) or 'no team'} "
        "(until a config that lists the rep as active is applied: set `active: false` in "
        "the YAML too)"
    )
    if args.reroute:
        _print_moves(cfg.org, d.moved, d.left)
    return EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    from connector.shell.explain import NotFound, format_explanation, load_explanation

    cfg = pick_org(_configs(args), args.org)
    try:
        e = load_explanation(open_database([cfg]), cfg, args.crm_id)
    except NotFound as exc:
        print(f"connector: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(e, indent=2) if args.json else format_explanation(e))
    return EXIT_OK


def _crm_problem(exc: CrmError | OSError) -> str:
    """`code: message` on one short line; adapters never put credentials in either."""
    if isinstance(exc, CrmError):
        code, message = exc.code, exc.message
    else:  # a network error an adapter let through
        code, message = "connection", type(exc).__name__
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = first if len(first) <= 200 else first[:197] + "..."
    return f"{code}: {first}" if first else code


def cmd_check_config(args: argparse.Namespace) -> int:
    sources = sorted(load_sources(config_path_from(args.config)), key=lambda s: s.config.org)
    configs = {s.config.org: s.config for s in sources}
    resolve_database_url(configs.values())  # its form, checked without connecting
    for source in sources:
        cfg = source.config
        members = sum(len(t.members) for t in cfg.teams)
        active = sum(1 for t in cfg.teams for m in t.members if m.active)
        default = any(r.when is None and r.territory is None for r in cfg.rules)
        rows = sum(len(t.table.rows) for t in cfg.territories.values())
        tables = (
            f", {len(cfg.territories)} territory tables ({rows} rows)" if cfg.territories else ""
        )
        print(
            f"org {cfg.org}: {cfg.crm.kind} {cfg.crm.object}, {len(cfg.teams)} teams, "
            f"{members} members ({active} active), {len(cfg.rules)} rules{tables}"
            + ("" if default else " (no default rule: unmatched leads stay unassigned)")
        )
        for warning in cfg.warnings():
            print(source.located(warning), file=sys.stderr)
    if not args.online:
        return EXIT_OK
    from connector.shell.adapters import adapter_for

    problems = 0
    for cfg in all_orgs(configs):
        ids = sorted({m.crm_user_id for t in cfg.teams for m in t.members if m.active})
        try:
            found = adapter_for(cfg).check_owners(ids)
        except (CrmError, OSError) as exc:
            problems += 1
            print(
                f"org {cfg.org}: cannot check owners in the CRM: {_crm_problem(exc)}",
                file=sys.stderr,
            )
            continue
        bad = 0
        for owner_id in ids:
            reason = found.get(owner_id, "not checked")
            if reason is not None:
                bad += 1
                print(f"org {cfg.org}: owner {owner_id}: {reason}", file=sys.stderr)
        problems += bad
        print(f"org {cfg.org}: {len(ids) - bad} of {len(ids)} active owners verified in the CRM")
        problems += _check_notifications(cfg)
    return EXIT_ERROR if problems else EXIT_OK


def _check_notifications(cfg: OrgConfig) -> int:
    from connector.notify.checks import online_check

    ok, problems = online_check(cfg)
    for line in ok:
        print(f"org {cfg.org}: {line}")
    for line in problems:
        print(f"org {cfg.org}: {line}", file=sys.stderr)
    return len(problems)


def cmd_notify(args: argparse.Namespace) -> int:
    from connector.notify.dispatch import finished_rows, retry_dead

    cfg = pick_org(_configs(args), args.org)
    engine = open_database([cfg])
    if args.action == "list":
        rows = finished_rows(engine, cfg.org, args.state, limit=args.limit)
        for r in rows:
            print(
                f"{r['id']}\t{r['kind']}\t{r['channel']}\t{r['recipient']}\t"
                f"lead={r['lead_id'] or '-'}\tattempts={r['attempts']}\t{r['last_error'] or ''}"
            )
        print(f"{len(rows)} {args.state} notifications", file=sys.stderr)
        return EXIT_OK
    n = retry_dead(engine, cfg.org, args.id or None)
    print(f"requeued {n} dead notifications")
    return EXIT_OK


def cmd_ingest(args: argparse.Namespace) -> int:
    from connector.intake.importer import detect_format, ingest_file
    from connector.routing.assign import Router

    cfg = pick_org(_configs(args), args.org)
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    fmt = args.format or detect_format(path)
    id_field = args.id_field or crm_kind(cfg.crm.kind).id_field
    engine = open_database([cfg])
    adapter = None
    if not args.no_verify:
        from connector.shell.adapters import adapter_for

        adapter = adapter_for(cfg, engine)
    summary = ingest_file(
        Router(engine, cfg),
        path,
        fmt,
        id_field,
        batch_size=args.batch_size,
        adapter=adapter,
    )
    for r in summary.rejected:
        print(f"{path}:{r.line}: rejected: {r.reason}", file=sys.stderr)
    s = summary.as_dict()
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(summary.skipped.items()))
    print(
        f"{path}: {s['new']} new ({s['assigned']} assigned, {s['unassigned']} unassigned), "
        f"{s['duplicate']} duplicate, {s['skipped']} skipped"
        + (f" ({skipped})" if skipped else "")
        + f", {s['rejected']} rejected"
        + ("" if adapter else " (not verified against the CRM: --no-verify)")
    )
    return EXIT_REJECTED if summary.rejected else EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from connector.shell.status import format_status, org_status

    cfg = pick_org(_configs(args), args.org)
    status = org_status(open_database([cfg]), cfg)
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    from connector.routing.replay_read import load_history
    from connector.routing.replay_report import format_report, report
    from connector.routing.simulate import simulate

    cfg = pick_org(_configs(args), args.org)
    since: datetime = args.since
    engine = open_database([cfg], migrate_now=False, apply_config=False)
    history = load_history(engine, cfg, since)
    result = simulate(cfg, history)
    rep = report(cfg, history, result, since)
    if args.plot:
        from connector.routing.replay_report import write_plot

        write_plot(rep, args.plot)
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return EXIT_OK


def cmd_dispatch(args: argparse.Namespace) -> int:
    from connector.core.crm_kinds import org_pacing
    from connector.core.pacing import Spacer
    from connector.shell.adapters import adapter_for
    from connector.shell.service import run_dispatch_service
    from connector.writeback.dispatch import Dispatcher

    if args.once and args.admin_port is not None:
        raise UsageError(
            "dispatch: --admin-port serves a running dispatcher; --once drains and exits"
        )
    configs = _configs(args)
    orgs = [pick_org(configs, args.org)] if args.org else list(all_orgs(configs))
    engine = open_database(orgs)
    warn_if_vacuum_off(engine)
    if not args.once:
        return run_dispatch_service(
            engine,
            {cfg.org: cfg for cfg in orgs},
            per_org=args.concurrency,
            lease_seconds=args.lease_seconds,
            admin_host=args.admin_host,
            admin_port=args.admin_port,
            admin_token=os.environ.get("CONNECTOR_ADMIN_TOKEN") or None,
        )
    failed = False
    for cfg in orgs:
        d = Dispatcher(
            engine,
            cfg.org,
            adapter_for(cfg, engine),
            lease_seconds=args.lease_seconds,
            intake_owner_ids=cfg.intake_owner_ids,
            spacer=Spacer(org_pacing(cfg.crm).cycle_s),
        )
        stats = d.drain(timeout=args.timeout)
        left, _ = d.open_rows()
        print(
            f"org {d.org}: {stats.sent} sent, {stats.dead} dead, {stats.retried} retried "
            f"in {stats.requests} CRM requests; {left} still open"
        )
        failed = failed or left > 0
    return EXIT_ERROR if failed else EXIT_OK


def cmd_outbox(args: argparse.Namespace) -> int:
    from connector.writeback.finished import finished_rows, retry_dead

    cfg = pick_org(_configs(args), args.org)
    engine = open_database([cfg])
    if args.action == "list":
        state = "superseded" if args.superseded else "dead"
        rows = finished_rows(engine, cfg.org, state, limit=args.limit)
        found = ["FOUND OWNER"] if state == "superseded" else []
        lines = table(
            ["ROW", "OBJECT", "CRM ID", "OWNER", *found, "ATTEMPTS", "LAST ERROR"],
            [
                [
                    r["id"],
                    r["crm_object"],
                    r["crm_id"],
                    r["owner_id"],
                    *([r["found_owner"] or ""] if found else []),
                    r["attempts"],
                    r["last_error"] or "",
                ]
                for r in rows
            ],
            right=(0, 5 if found else 4),
        )
        if rows:
            print("\n".join(lines))
        print(f"{len(rows)} {state} rows", file=sys.stderr)
        return EXIT_OK
    if args.superseded:
        raise ConfigError("superseded rows are never retried: a person set that owner in the CRM")
    n = retry_dead(engine, cfg.org, args.id or None)
    print(f"requeued {n} dead rows (each is checked against the CRM's owner before its write)")
    return EXIT_OK


def cmd_inbox(args: argparse.Namespace) -> int:
    from connector.intake.inbox import list_events, retry_dead

    cfg = pick_org(_configs(args), args.org)
    engine = open_database([cfg])
    if args.action == "list":
        rows = list_events(engine, cfg.org, args.state, limit=args.limit)
        lines = table(
            ["EVENT", "SOURCE", "CRM ID", "ATTEMPTS", "LAST ERROR"],
            [
                [r["id"], r["source"], r["crm_id"], r["attempts"], r["last_error"] or ""]
                for r in rows
            ],
            right=(0, 3),
        )
        if rows:
            print("\n".join(lines))
        print(f"{len(rows)} {args.state} events", file=sys.stderr)
        return EXIT_OK
    n = retry_dead(engine, cfg.org, args.id or None)
    print(f"requeued {n} dead events")
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    from connector.shell.retention import purge

    configs = _configs(args)
    orgs = [pick_org(configs, args.org)] if args.org else list(all_orgs(configs))
    engine = open_database(orgs)
    for cfg in orgs:
        days = args.days or cfg.retention_days
        n = purge(engine, cfg.org, days)
        print(
            f"org {cfg.org}: older than {days} days: {n.fields_cleared} leads' fields cleared, "
            f"{n.events_deleted} inbox events, {n.outbox_deleted} outbox rows, "
            f"{n.notifications_deleted} sent notifications and "
            f"{n.skips_deleted} skip records deleted"
        )
    return EXIT_OK


def cmd_rep(args: argparse.Namespace) -> int:
    from connector.routing.rep_state import fmt_utc
    from connector.shell.reps import away_command, back_command, rep_rows

    cfg = pick_org(_configs(args), args.org)
    now = datetime.now(UTC)
    if args.action == "deactivate":
        return _rep_deactivate(args, cfg)
    if args.action == "list":
        rows = rep_rows(open_database([cfg]), cfg, now)
        print(
            "\n".join(
                table(
                    ["REP", "NAME", "TEAMS", "NOW"],
                    [[r.crm_user_id, r.name, ",".join(r.teams), state] for r, state in rows],
                )
            )
        )
        return EXIT_OK
    if args.action == "away":
        engine = open_database([cfg])
        rep, until = away_command(engine, cfg, args.rep, args.until, args.reason, now)
        print(f"{rep.name} ({rep.crm_user_id}) is away until {fmt_utc(until)}")
        return EXIT_OK
    rep, ended = back_command(open_database([cfg]), cfg, args.rep)
    if ended:
        print(f"{rep.name} ({rep.crm_user_id}) is back")
    else:
        print(f"{rep.name} ({rep.crm_user_id}) had no time off set from the command line")
    return EXIT_OK


def _service(args: argparse.Namespace, *, receiver: bool, scheduler: bool, dispatch: bool) -> int:
    from connector.intake.admission import DEFAULT_MAX_CONNECTIONS_PER_PEER
    from connector.intake.receivers import trusted_proxies_from_env
    from connector.shell.fd_limits import DEFAULT_MAX_CONNECTIONS, count_from_env
    from connector.shell.service import run_service

    max_connections = count_from_env("CONNECTOR_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS)
    if max_connections < 1:
        raise ConfigError("CONNECTOR_MAX_CONNECTIONS must be at least 1")
    per_peer = count_from_env(
        "CONNECTOR_MAX_CONNECTIONS_PER_PEER", DEFAULT_MAX_CONNECTIONS_PER_PEER
    )
    configs = _configs(args)
    engine = open_database(list(configs.values()))
    return run_service(
        engine,
        configs,
        host=args.host,
        port=args.port,
        receiver=receiver,
        scheduler=scheduler,
        dispatch=dispatch,
        dispatchers_per_org=args.dispatchers,
        public_base_url=os.environ.get("CONNECTOR_PUBLIC_BASE_URL") or None,
        lease_seconds=args.lease_seconds,
        admin_host=args.admin_host,
        admin_port=None if args.no_admin else args.admin_port,
        admin_token=os.environ.get("CONNECTOR_ADMIN_TOKEN") or None,
        trusted_proxies=trusted_proxies_from_env(),
        max_connections=max_connections,
        max_connections_per_peer=per_peer or None,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    return _service(args, receiver=True, scheduler=False, dispatch=False)


def cmd_run(args: argparse.Namespace) -> int:
    return _service(args, receiver=True, scheduler=True, dispatch=True)


def cmd_sync(args: argparse.Namespace) -> int:
    if not args.once:
        return _service(args, receiver=False, scheduler=True, dispatch=False)
    from connector.intake.poller import Poller
    from connector.shell.adapters import adapter_for

    configs = _configs(args)
    orgs = [pick_org(configs, args.org)] if args.org else list(all_orgs(configs))
    engine = open_database(orgs)
    for cfg in orgs:
        r = Poller(engine, cfg, adapter_for(cfg, engine)).poll_once()
        if not r.ran:
            print(f"org {cfg.org}: another process is polling; skipped")
            continue
        print(
            f"org {cfg.org}: {r.seen} records read, {r.new} new, {r.duplicate} repeats, "
            f"{r.skipped_owned} already owned, {r.rejected} rejected; "
            f"watermark {r.watermark.isoformat() if r.watermark else 'none'}"
        )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from connector.shell.demo import run_demo

    return run_demo(sf_leads=args.sf_leads, hs_leads=args.hs_leads, senders=args.senders)
