"""The `connector` command line."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from connector import __version__
from connector.core.config import ConfigError
from connector.core.config_loading import ConfigProblems
from connector.core.errors import DatabaseError, DatabaseUnavailable, UsageError
from connector.shell.commands import (
    EXIT_DB_UNAVAILABLE,
    EXIT_ERROR,
    EXIT_USAGE,
    cmd_check_config,
    cmd_demo,
    cmd_dispatch,
    cmd_explain,
    cmd_inbox,
    cmd_ingest,
    cmd_migrate,
    cmd_outbox,
    cmd_purge,
    cmd_reassign,
    cmd_rep,
    cmd_run,
    cmd_serve,
    cmd_simulate,
    cmd_status,
    cmd_sync,
)


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A command handler imported when its command runs (not on every start of the CLI)."""

    def run(args: argparse.Namespace) -> int:
        handler: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(module), name
        )
        return handler(args)

    return run


def _positive_int(value: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return n


def parse_since(value: str, now: datetime) -> datetime:
    """`--since`: a span back from now (``30d``, ``12h``, ``90m``) or an ISO date/time (UTC
    unless it names a zone)."""
    value = value.strip()
    units = {"d": "days", "h": "hours", "m": "minutes"}
    if value[-1:] in units and value[:-1].isdigit():
        return now - timedelta(**{units[value[-1]]: int(value[:-1])})
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {value!r}: give a span like 30d, 12h or 90m, or a date like 2026-11-01"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _since_arg(value: str) -> datetime:
    return parse_since(value, datetime.now(UTC))


def _svg_arg(value: str) -> Path:
    if not value.lower().endswith(".svg"):
        raise argparse.ArgumentTypeError(f"{value}: only SVG is drawn; name the file *.svg")
    return Path(value)


def _global_options(
    parser: argparse.ArgumentParser, default_config: str | None, default_level: str
) -> None:
    """--config and --log-level, accepted before or after the command (after wins)."""
    where = " May come before or after the command; given in both places, the one after wins."
    parser.add_argument(
        "--config",
        metavar="FILE_OR_FOLDER",
        default=default_config,
        help="org YAML file or folder of them (default $CONNECTOR_CONFIG)." + where,
    )
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        default=default_level,
        help="logging level (default $CONNECTOR_LOG_LEVEL, else WARNING)." + where,
    )


def _admin_args(s: argparse.ArgumentParser, port: int | None, port_help: str | None) -> None:
    """--admin-host and --admin-port: where /healthz, /metrics and the dashboard listen."""
    s.add_argument(
        "--admin-host",
        default=os.environ.get("CONNECTOR_ADMIN_HOST", "127.0.0.1"),
        help="where /healthz and /metrics listen (off loopback needs CONNECTOR_ADMIN_TOKEN)",
    )
    s.add_argument("--admin-port", type=int, default=port, help=port_help)


def _add_migrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector migrate`."""
    s = sub.add_parser("migrate", help="apply schema migrations and the configured teams")
    s.add_argument(
        "--reroute",
        action="store_true",
        help="re-route leads of inactive reps whose owner write was not sent yet",
    )
    s.set_defaults(func=cmd_migrate)


def _add_reassign(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector reassign`."""
    s = sub.add_parser("reassign", help="give routed leads to another rep")
    s.add_argument("--org")
    how = s.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--rotate", action="store_true", help="the next rep of the lead's team by the rotation"
    )
    how.add_argument("--to", metavar="REP", help="this rep (crm_user_id or name)")
    s.add_argument("--reason", metavar="TEXT", help="why (kept in the history)")
    s.add_argument(
        "--force",
        action="store_true",
        help="(--to) give the leads even when the rep is away, off shift or capped now",
    )
    s.add_argument("crm_ids", nargs="+", metavar="CRM_ID")
    s.set_defaults(func=cmd_reassign)


def _add_explain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector explain`."""
    s = sub.add_parser("explain", help="how a lead was routed, from what was recorded then")
    s.add_argument("--org")
    s.add_argument("--json", action="store_true")
    s.add_argument("crm_id", metavar="CRM_ID")
    s.set_defaults(func=cmd_explain)


def _add_check_config(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector check-config`."""
    s = sub.add_parser("check-config", help="validate the org configs")
    s.add_argument(
        "--online",
        action="store_true",
        help="also check in the CRM that every active owner exists and is active",
    )
    s.set_defaults(func=cmd_check_config)


def _add_ingest(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector ingest`."""
    s = sub.add_parser("ingest", help="import leads from a JSON lines or CSV file")
    s.add_argument("--org")
    s.add_argument("--format", choices=["jsonl", "csv"])
    s.add_argument("--id-field", help="column holding the CRM id (Salesforce Id, HubSpot id)")
    s.add_argument("--batch-size", type=_positive_int, default=500)
    s.add_argument(
        "--no-verify",
        action="store_true",
        help="route the file's rows with the file's fields, without reading each record "
        "from the CRM first (offline backfills; person-owned records then take rotation "
        "turns, though the write-back still never overwrites a person's owner)",
    )
    s.add_argument("file")
    s.set_defaults(func=cmd_ingest)


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector status`."""
    s = sub.add_parser("status", help="leads, per-rep counts and outbox for one org")
    s.add_argument("--org")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)


def _add_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector simulate`."""
    s = sub.add_parser(
        "simulate",
        help="replay the stored leads through a proposed config (--config NEW.yaml); "
        "writes nothing",
    )
    s.add_argument("--org")
    s.add_argument(
        "--since",
        type=_since_arg,
        default="30d",
        help="the window: 30d, 12h, 90m or an ISO date (default 30d)",
    )
    s.add_argument("--json", action="store_true")
    s.add_argument(
        "--plot", metavar="FILE.svg", type=_svg_arg, help="draw before/after per rep as SVG"
    )
    s.set_defaults(func=cmd_simulate)


def _add_dispatch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector dispatch`."""
    s = sub.add_parser("dispatch", help="write assigned owners back to the CRM")
    s.add_argument("--org")
    s.add_argument("--once", action="store_true", help="drain what is pending, then exit")
    s.add_argument("--timeout", type=float, default=600.0, help="--once gives up after this")
    s.add_argument("--concurrency", type=int, default=2, help="dispatchers per org")
    s.add_argument(
        "--lease-seconds",
        type=float,
        default=60.0,
        help="a claim not finished within this is taken over by another dispatcher (a live "
        "claim renews it before a CRM call once a quarter has gone; keep it above 55 s: the "
        "CRM timeout of 30 s plus a rate-limit wait must fit in three quarters of it)",
    )
    _admin_args(
        s,
        None,
        "serve /healthz (ready once the outbox listener listens), /metrics and the dashboard "
        "here (default: off, so a dispatch process beside `connector run` on one host takes "
        "no port of its own unless asked)",
    )
    s.set_defaults(func=cmd_dispatch)


def _add_outbox(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector outbox`."""
    s = sub.add_parser("outbox", help="list dead or superseded owner writes, or requeue dead ones")
    s.add_argument("action", choices=["list", "retry"])
    s.add_argument("--org")
    which = s.add_mutually_exclusive_group()
    which.add_argument("--dead", action="store_true", help="dead rows, with the CRM's reason")
    which.add_argument(
        "--superseded",
        action="store_true",
        help="(list) writes dropped because a person had set another owner",
    )
    s.add_argument("--id", type=int, action="append", help="(retry) only these rows")
    s.add_argument("--limit", type=int, default=100)
    s.set_defaults(func=cmd_outbox)


def _add_inbox(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector inbox`."""
    s = sub.add_parser("inbox", help="list pushed events by state, or requeue dead ones")
    s.add_argument("action", choices=["list", "retry"])
    s.add_argument("--org")
    s.add_argument(
        "--state",
        choices=["dead", "pending", "claimed", "skipped", "done"],
        default="dead",
        help="(list) which events; dead by default",
    )
    s.add_argument("--id", type=int, action="append", help="(retry) only these events")
    s.add_argument("--limit", type=int, default=100)
    s.set_defaults(func=cmd_inbox)


def _add_rep(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> list[argparse.ArgumentParser]:
    """`connector rep`. The parsers of its actions."""
    s = sub.add_parser(
        "rep", help="time off from the command line (rep away|back REP, rep list); rep deactivate"
    )
    rep_sub = s.add_subparsers(dest="action", required=True)
    rep_parsers = []
    for action, text in (
        ("away", "the rep gets no lead until --until"),
        ("back", "end the rep's time off set from the command line"),
        ("list", "every rep of the org, available or away until when"),
        ("deactivate", "make the rep inactive in every team of the org now"),
    ):
        r = rep_sub.add_parser(action, help=text)
        if action != "list":
            r.add_argument("rep", metavar="REP", help="the rep's crm_user_id or name")
        else:
            r.set_defaults(rep=None)
        r.add_argument("--org")
        if action == "away":
            r.add_argument(
                "--until",
                help="when the rep is back: ISO 8601, e.g. 2026-12-24T09:00 (without an "
                "offset, in the rep's time zone)",
            )
            r.add_argument("--reason", help="shown by `rep list`")
        else:
            r.set_defaults(until=None, reason=None)
        if action == "deactivate":
            r.add_argument("--reroute", action="store_true", help="re-route their unsent leads")
        else:
            r.set_defaults(reroute=False)
        r.set_defaults(func=cmd_rep)
        rep_parsers.append(r)
    return rep_parsers


def _add_purge(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector purge`."""
    s = sub.add_parser(
        "purge", help="delete received field values and finished rows past the retention"
    )
    s.add_argument("--org")
    s.add_argument("--days", type=_positive_int, help="override the orgs' retention_days")
    s.set_defaults(func=cmd_purge)


def _add_services(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector serve`, `run` and `sync`: the long-running processes."""
    for name, func, text in (
        ("serve", cmd_serve, "the webhook receiver only"),
        ("run", cmd_run, "receiver + scheduled poll + dispatchers (the production default)"),
        ("sync", cmd_sync, "the scheduled poll only"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("--host", default=os.environ.get("CONNECTOR_HOST", "127.0.0.1"))
        s.add_argument("--port", type=int, default=int(os.environ.get("CONNECTOR_PORT", "8080")))
        s.add_argument("--dispatchers", type=int, default=2, help="dispatcher threads per org")
        _admin_args(s, int(os.environ.get("CONNECTOR_ADMIN_PORT", "9100")), None)
        s.add_argument("--no-admin", action="store_true", help="no admin listener")
        s.add_argument(
            "--lease-seconds",
            type=float,
            default=None,
            help="claims of a process that died are taken over after this "
            "(default 60 for CRM writes, 120 for webhook events)",
        )
        if name == "sync":
            s.add_argument("--once", action="store_true", help="poll every org once, then exit")
            s.add_argument("--org")
        s.set_defaults(func=func)


def _add_sandbox(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector sandbox`."""
    s = sub.add_parser("sandbox", help="run a local CRM API simulator")
    s.add_argument("kind", choices=["salesforce", "hubspot"])
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8900)
    s.add_argument(
        "--limit-per-10s",
        type=int,
        default=100,
        help="hubspot: calls a token may make in any 10 s before 429 (HubSpot's tiers: 100, "
        "190, 250; default 100)",
    )
    s.add_argument(
        "--write-config",
        metavar="FILE",
        help="write a ready org config for this sandbox to FILE and print the export lines "
        "of the secrets it names",
    )
    s.set_defaults(func=_lazy("connector.shell.sandbox_cmd", "cmd_sandbox"))


def _add_send(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector send`."""
    s = sub.add_parser(
        "send",
        help="push records to a running connector as the CRM would: a Salesforce Outbound "
        "Message or a signed HubSpot webhook",
    )
    s.add_argument("--org")
    s.add_argument(
        "--url",
        metavar="BASE_URL",
        help="the connector's webhook listener (default http://127.0.0.1:$CONNECTOR_PORT, "
        "else port 8080)",
    )
    s.add_argument(
        "--object",
        metavar="KIND",
        help="the record kind the message names (default: the org's crm.object)",
    )
    s.add_argument("record_ids", nargs="+", metavar="RECORD_ID")
    s.set_defaults(func=_lazy("connector.shell.send", "cmd_send"))


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`connector demo`."""
    s = sub.add_parser(
        "demo", help="the whole flow on an embedded Postgres and local CRM sandboxes"
    )
    s.add_argument("--sf-leads", type=int, default=600)
    s.add_argument("--hs-leads", type=int, default=400)
    s.add_argument("--senders", type=int, default=16)
    s.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="connector", description=__doc__)
    p.add_argument("--version", action="version", version=f"connector {__version__}")
    _global_options(p, None, os.environ.get("CONNECTOR_LOG_LEVEL", "WARNING"))
    sub = p.add_subparsers(dest="command", required=True)
    _add_migrate(sub)
    _add_reassign(sub)
    _add_explain(sub)
    _add_check_config(sub)
    _add_ingest(sub)
    _add_status(sub)
    _add_simulate(sub)
    _add_dispatch(sub)
    _add_outbox(sub)
    _add_inbox(sub)
    rep_parsers = _add_rep(sub)
    _add_purge(sub)
    _add_services(sub)
    _add_sandbox(sub)
    _add_send(sub)
    _add_demo(sub)
    for subparser in [*sub.choices.values(), *rep_parsers]:
        # after the command too; SUPPRESS keeps a value given before it when this one is absent
        _global_options(subparser, argparse.SUPPRESS, argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        code: int = args.func(args)
        return code
    except ConfigProblems as exc:  # one line each: file:line: key.path: problem; fix
        print("\n".join(exc.lines), file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, UsageError) as exc:
        print(f"connector: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DatabaseUnavailable as exc:  # one line: it names the server, never a row value
        print(f"connector: {exc.message}", file=sys.stderr)
        return EXIT_DB_UNAVAILABLE
    except DatabaseError as exc:
        print(f"connector: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
