"""`--log-format json`: one JSON object a line with level, logger, message and the ids a
record carries; unit tests of the formatter, the refusals of bad values, and a real
`connector run` whose every log line is JSON."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from connector.core.errors import UsageError
from connector.shell.cli import main
from connector.shell.logs import JsonFormatter, configure_logging, log_format_from
from testbed.waiting import wait_until
from tests.helpers.faults import (
    SF_PATH,
    TwoOrgs,
    connector_env,
    post_soap,
    service,
    soap_body,
)
from tests.helpers.sample_org import SAMPLE_ENV, SAMPLE_YAML


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.getLogger("connector.test").makeRecord(
        "connector.test", logging.WARNING, __file__, 1, msg, args, None, extra=extra
    )
    return record


def test_a_record_is_one_line_of_json_with_its_extras() -> None:
    record = _record("org %s: row %d\nis dead", "acme", 7, org="acme", outbox_id=7, ids=["a", "b"])
    line = JsonFormatter().format(record)
    assert "\n" not in line
    got = json.loads(line)
    assert got["level"] == "WARNING"
    assert got["logger"] == "connector.test"
    assert got["message"] == "org acme: row 7\nis dead"
    assert (got["org"], got["outbox_id"], got["ids"]) == ("acme", 7, ["a", "b"])
    assert got["time"].endswith("+00:00")
    # nothing of LogRecord's own attributes but these
    assert set(got) == {"time", "level", "logger", "message", "org", "outbox_id", "ids"}


def test_a_traceback_and_values_json_cannot_hold() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info(), extra={"p": Path("/a")}
        )
    got = json.loads(JsonFormatter().format(record))
    assert got["p"] == "/a"
    assert got["exc_info"].startswith("Traceback") and "ValueError: boom" in got["exc_info"]


def test_log_format_from_the_option_the_environment_or_text() -> None:
    assert log_format_from(None, {}) == "text"
    assert log_format_from(None, {"CONNECTOR_LOG_FORMAT": "JSON"}) == "json"
    assert log_format_from("text", {"CONNECTOR_LOG_FORMAT": "json"}) == "text"
    with pytest.raises(UsageError) as exc:
        log_format_from(None, {"CONNECTOR_LOG_FORMAT": "xml"})
    assert str(exc.value) == "CONNECTOR_LOG_FORMAT: 'xml' is not one of text, json"


@contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger without pytest's handlers (restored after)."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    for h in saved:
        root.removeHandler(h)
    try:
        yield root
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


def test_configure_logging_writes_json_and_replaces_its_own_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    with bare_root() as root:
        configure_logging("info", "text", first)
        configure_logging("info", "json", second)  # a second call replaces the first handler
        assert len(root.handlers) == 1
        logging.getLogger("connector.test_json").info("started", extra={"org": "acme"})
    assert first.getvalue() == ""
    got = json.loads(second.getvalue())
    assert (got["logger"], got["message"], got["org"]) == ("connector.test_json", "started", "acme")


def test_configure_logging_leaves_a_runner_s_logging_alone() -> None:
    theirs = logging.StreamHandler(io.StringIO())
    with bare_root() as root:
        root.addHandler(theirs)
        configure_logging("debug", "json", io.StringIO())
        assert root.handlers == [theirs]


def test_scheduler_job_runs_are_not_logged_at_info_but_its_errors_are() -> None:
    out = io.StringIO()
    executors = logging.getLogger("apscheduler.executors.default")
    try:
        with bare_root():
            configure_logging("info", "text", out)
            executors.info('Running job "_safe_poll"')
            executors.error('Job "_safe_poll" raised an exception')
            configure_logging("debug", "text", out)
            executors.info('Job "_safe_poll" executed successfully')
    finally:
        logging.getLogger("apscheduler.executors").setLevel(logging.NOTSET)
    lines = [line.split(" ", 2)[2] for line in out.getvalue().splitlines()]
    assert lines == [
        'ERROR apscheduler.executors.default Job "_safe_poll" raised an exception',
        'INFO apscheduler.executors.default Job "_safe_poll" executed successfully',
    ]


def test_configure_logging_refuses_an_unknown_level() -> None:
    with bare_root() as root:
        with pytest.raises(UsageError) as exc:
            configure_logging("loud", "text", io.StringIO())
        assert root.handlers == []
    assert str(exc.value) == "--log-level: 'loud' is not a logging level"


def test_bad_log_formats_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "acme.yaml"
    config.write_text(SAMPLE_YAML)
    for name, value in SAMPLE_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(config), "--log-format", "xml", "check-config"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(
        "connector: argument --log-format: invalid choice: 'xml' (choose from"
    )
    monkeypatch.setenv("CONNECTOR_LOG_FORMAT", "xml")
    assert main(["--config", str(config), "check-config"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "connector: CONNECTOR_LOG_FORMAT: 'xml' is not one of text, json\n")


@pytest.mark.two_orgs(hubspot=False, poll=False)
def test_run_logs_one_json_object_a_line(two_orgs: TwoOrgs, db_url: str, tmp_path: Path) -> None:
    """A pushed lead is routed; every line the process wrote is JSON, and the records about
    the lead carry its ids as fields."""
    orgs = two_orgs
    lead = orgs.sf.add_record("Lead", owner_id=orgs.intake, fields={"Country": "US"})
    proc = service(
        "run", "run", orgs.config_dir, connector_env(db_url), tmp_path, "--log-format", "json"
    ).start()
    try:
        proc.wait_healthy()
        with httpx.Client(timeout=10) as client:
            assert post_soap(client, proc.url + SF_PATH, soap_body([(lead, {})], 1)) == 200

        def routed() -> bool:
            record = orgs.sf.get_record(lead)
            return record is not None and record["OwnerId"] in orgs.reps

        wait_until(routed, 60, "the pushed lead to be routed and written back")
    finally:
        code = proc.stop()
    assert code == 0, proc.tail()
    lines = proc.logs[-1].read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    stored = [r for r in records if r["logger"] == "connector.intake.receivers"]
    assert stored and stored[0]["org"] == "demo-sf"
    assert any(lead in event for event in stored[0]["event_ids"])
    routed_lines = [r for r in records if lead in r.get("crm_ids", [])]
    assert routed_lines and routed_lines[0]["logger"] == "connector.intake.inbox"
    assert routed_lines[0]["level"] == "INFO"
    assert records[-1]["message"] == "connector stopped"
