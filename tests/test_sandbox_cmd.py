"""`connector sandbox`: it prints what a config needs, writes a config that the other
commands accept as is, and refuses bad input in one line (exit 2) without touching files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from connector.core.config_loading import load_configs
from connector.shell.cli import main
from connector.shell.demo_world import ENV, HS_OWNER_NAMES, HS_PORTAL
from testbed.waiting import wait_until
from tests.helpers.ports import free_port


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("CONNECTOR_", "DEMO_")):
            monkeypatch.delenv(name)


@pytest.fixture
def hubspot_sandbox(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, int]]:
    port = free_port()
    log = tmp_path / "sandbox.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "connector",
                "sandbox",
                "hubspot",
                "--port",
                str(port),
                "--write-config",
                "hubspot.yaml",
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield proc, log, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_hubspot_sandbox_prints_what_a_config_needs_and_writes_one(
    hubspot_sandbox: tuple[subprocess.Popen[str], Path, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clean_env: None,
) -> None:
    proc, log, port = hubspot_sandbox
    wait_until(lambda: "export DEMO_HS_WEBHOOK_SECRET=" in log.read_text(), 60, "the sandbox")
    lines = log.read_text().splitlines()
    url = f"http://127.0.0.1:{port}"
    assert lines[0] == f"hubspot sandbox on {url} (in memory; Ctrl-C stops it)"
    assert f"  base_url:         {url}" in lines
    assert "  access_token:     sandbox-token (private app)" in lines
    assert f"  portal_id:        {HS_PORTAL} (what its webhook events carry)" in lines
    for n, name in enumerate(HS_OWNER_NAMES):
        assert f"    {101 + n:<20} {name}" in lines
    exports = [line for line in lines if line.startswith("export ")]
    assert exports == [
        f"export DEMO_HS_TOKEN={ENV['DEMO_HS_TOKEN']}",
        f"export DEMO_HS_WEBHOOK_SECRET={ENV['DEMO_HS_WEBHOOK_SECRET']}",
    ]

    # The config as written, with the printed exports, passes the online check.
    for line in exports:
        name, _, value = line.removeprefix("export ").partition("=")
        monkeypatch.setenv(name, value)
    config = tmp_path / "hubspot.yaml"
    assert main(["--config", str(config), "check-config", "--online"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "org sandbox-hs: hubspot contacts, 2 teams, 4 members (4 active), 2 rules",
        "org sandbox-hs: 4 of 4 active owners verified in the CRM",
    ]
    # As a real portal's config does, it polls (every 60 s) for contacts whose webhooks never
    # came; only the demo's config turns the poll off.
    poll = load_configs(config)["sandbox-hs"].poll
    assert poll.enabled and poll.interval_seconds == 60
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_ctrl_c_stops_it_even_when_started_with_ctrl_c_ignored(tmp_path: Path) -> None:
    """A shell's `&` without job control starts its command with SIGINT ignored, and a Python
    program then gets no KeyboardInterrupt: the sandbox handles SIGINT itself, so Ctrl-C
    (SIGINT to its process group) still stops it, cleanly."""
    port = free_port()
    log = tmp_path / "sandbox.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "connector", "sandbox", "salesforce", "--port", str(port)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        wait_until(lambda: "Ctrl-C stops it" in log.read_text(), 60, "the sandbox")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_write_config_into_a_missing_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "nowhere" / "sb.yaml"
    args = ["sandbox", "salesforce", "--port", str(free_port()), "--write-config", str(target)]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"connector: sandbox: --write-config {target}: no such folder {target.parent}\n"
    )
    assert not target.parent.exists()


def test_a_file_it_did_not_write_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "acme.yaml"
    target.write_text("org: acme\n")
    args = ["sandbox", "salesforce", "--port", str(free_port()), "--write-config", str(target)]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        f"connector: sandbox: --write-config {target}: the file exists and was not written "
        "by this command; name a new file\n"
    )
    assert target.read_text() == "org: acme\n"


def test_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["sandbox", "hubspot", "--port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"connector: sandbox: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )
