"""`connector` processes forked from a fork server that imported the command line once.

A fresh `python -m connector` spends about 0.8 s of CPU importing the project and its
libraries before it does anything (pydantic, SQLAlchemy, psycopg, uvicorn, ...); the fault
scenarios start dozens of them (the kill -9 scenario restarts one every ~200 ms) and the
command-line tests run 16 at once, twice. A process forked from the fork server runs the
same `connector.shell.cli.main` with its own arguments, environment, working folder and
output file, as a process of its own (its own pid, connections, signal handlers; killed
with SIGKILL like any other), without those imports: a few milliseconds of CPU to start.

The fork server imports modules only: no connection, no thread, no engine is made at import
(nothing a child could share by accident). The same server forks the concurrency harness's
workers (``testbed.harness.worker_context``): a process has one fork server, whose preload
list is fixed when it starts, so both use the one list here.

What these processes do not cover is the interpreter's start itself (the `connector` script,
`python -m connector`): the tests that run the command the way a user does keep real
subprocesses for that (tests/test_demo.py, tests/test_tutorial.py, test_cli's `status`).
"""

from __future__ import annotations

import atexit
import io
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

# the command line and what its commands import when they run (connector/shell/commands.py
# imports most of these inside the command's function)
PRELOAD = [
    "testbed.harness",
    "connector.shell.cli",
    "connector.shell.commands",
    "connector.shell.service",
    "connector.shell.adapters",
    "connector.shell.status",
    "connector.intake.poller",
    "connector.intake.importer",
    "connector.intake.inbox",
    "connector.routing.assign",
    "connector.routing.teams",
    "connector.writeback.dispatch",
    "connector.notify.dispatch",
    # the CRM adapters, imported when a command first makes one (simple-salesforce with
    # requests and PyJWT, hubspot-api-client): about 0.45 s of CPU a start, without them here
    "crm_adapters.salesforce",
    "crm_adapters.hubspot",
    # the dashboard (Jinja2), imported when a service sets up its admin listener
    "connector.shell.dashboard",
    # last: what the modules above built, frozen out of the collector's sight
    "testbed.frozen_heap",
]


def fork_context() -> Any:
    """The multiprocessing context of the fork server (started on first use)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _stream(fd: int) -> io.TextIOWrapper:
    """A text stream on ``fd`` that writes through at once (as with PYTHONUNBUFFERED=1)."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        raw, encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=True
    )


def _main(argv: list[str], env: dict[str, str], out: str, err: str, cwd: str) -> None:
    """In the forked child: stdout to ``out`` and stderr to ``err`` (appended; the same file
    may be both), ``env`` as the whole environment, ``cwd`` as the working folder, then the
    command line's ``main``; the exit handlers run at the end, as at an interpreter's exit."""
    for path, target in ((out, 1), (err, 2)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout, sys.stderr = _stream(1), _stream(2)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    from connector.shell.cli import main

    try:
        code = main(argv)
    finally:
        atexit._run_exitfuncs()
    sys.exit(code)


class Forked:
    """A forked `connector` process with the part of ``subprocess.Popen``'s interface the
    tests use (pid, poll, wait, kill, send_signal, returncode)."""

    def __init__(
        self, argv: list[str], env: dict[str, str], out: Path, cwd: Path, err: Path | None = None
    ) -> None:
        """``connector ARGV`` with stdout to ``out`` and stderr to ``err`` (default: ``out``
        too), both appended to."""
        self.args = ["connector", *argv]
        err = out if err is None else err
        out.touch()
        err.touch()
        self._proc: BaseProcess = fork_context().Process(
            target=_main,
            args=(list(argv), dict(env), str(out), str(err), str(cwd)),
            name="connector",
        )
        self._proc.start()
        assert self._proc.pid is not None
        self.pid: int = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        code = self._proc.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a signal to a pid that may have been reused
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def wait_or_kill(proc: Forked, timeout: float = 300) -> int:
    """``proc``'s exit status; killed (and the TimeoutExpired raised) after ``timeout`` s."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def finish(
    proc: Forked, out: Path, err: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Wait for ``proc`` (killed after ``timeout`` s) and read what it wrote to ``out`` and
    ``err``."""
    code = wait_or_kill(proc, timeout)
    return subprocess.CompletedProcess(
        proc.args, code, out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8")
    )
