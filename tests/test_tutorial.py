"""docs/tutorial.md, run as written, so the tutorial cannot rot.

Every ```` ```sh ```` block runs in order in one shell session (bash; the variables it exports
and the folder it changes to carry over to the next block), exactly as written, and must
exit 0. The second word of a block's info string says how:

- none: run it and wait;
- ``background``: a second or third terminal: started, left running, and stopped at the end
  with Ctrl-C (SIGINT), as the tutorial says;
- ``retry``: a check a person would run again until it shows the state: repeated until it
  exits 0 and shows its output (a minute at most);
- ``not-tested``: the install, which this test runs inside of (only that block may be so).

A ```` ```text ```` block right after a command block is what the command prints: each line
must appear, in order, consecutive lines together; ``...`` alone skips any lines, and inside
a line matches any text.

Two things are changed, both to let test runs share a machine: the ports 8900, 8080 and 9100
become free ones (the connector takes its default ports from ``CONNECTOR_PORT`` and
``CONNECTOR_ADMIN_PORT``, set to those), and the folder ``/tmp/tutorial`` becomes a new one.
With ``TEST_DATABASE_URL`` the connector uses a fresh database of that server
(``DATABASE_URL``); otherwise the tutorial's own embedded PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from connector.shell.store import make_embedded_tempdir
from testbed.waiting import wait_until
from tests.helpers.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
DOC_PORTS = {"sandbox": 8900, "connector": 8080, "admin": 9100}
DOC_FOLDER = "/tmp/tutorial"
MODES = ("run", "background", "retry", "not-tested")
RETRY_S = 60.0
STEP_TIMEOUT_S = 240.0

# The leads the tutorial creates: two to route, one a person gave to Ada.
ROUTED = ("00QSB00000000082AA", "00QSB00000000092AA")
PERSONS = ("00QSB00000000102AA", "005SB0000000001YAA")


@dataclass
class Step:
    mode: str
    script: str
    shown: list[str] | None = None  # the output block after it


def steps(text: str) -> list[Step]:
    """The command blocks of the doc, each with the output block that follows it."""
    out: list[Step] = []
    for m in FENCE.finditer(text):
        info, body = m.group(1).split(), m.group(2)
        if info[:1] == ["sh"]:
            mode = info[1] if len(info) > 1 else "run"
            assert mode in MODES, f"unknown mode {mode!r} of a sh block"
            out.append(Step(mode, body))
        elif info[:1] == ["text"]:
            assert out and out[-1].shown is None, "a text block shows the output of a sh block"
            out[-1].shown = body.splitlines()
    return out


def missing(output: str, shown: list[str]) -> str | None:
    """None when ``output`` shows ``shown`` (see the module doc), else the first line not
    found."""
    lines = [line.rstrip() for line in output.splitlines()]
    groups: list[list[tuple[str, re.Pattern[str]]]] = [[]]
    for want in shown:
        if want.strip() == "...":
            groups.append([])
        else:
            parts = want.rstrip().split("...")
            groups[-1].append((want, re.compile(".*".join(re.escape(p) for p in parts))))
    at = 0
    for group in (g for g in groups if g):
        start = next(
            (
                i
                for i in range(at, len(lines) - len(group) + 1)
                if all(p.fullmatch(lines[i + k]) for k, (_, p) in enumerate(group))
            ),
            None,
        )
        if start is None:
            return group[0][0]
        at = start + len(group)
    return None


def test_missing_matches_lines_in_order() -> None:
    out = "a 1\nb 2\nc 3\nd 4\n"
    assert missing(out, ["a 1", "b 2", "...", "d ..."]) is None
    assert missing(out, ["a 1", "c 3"]) is not None  # consecutive lines stay consecutive
    assert missing(out, ["c 3", "...", "a 1"]) is not None  # order counts
    assert missing(out, ["b"]) is not None  # a whole line, not a part of one


def localized(text: str, ports: dict[str, int], folder: Path) -> str:
    for name, port in DOC_PORTS.items():
        text = re.sub(rf"\b{port}\b", str(ports[name]), text)
    return text.replace(DOC_FOLDER, str(folder))


@dataclass
class Session:
    """One shell session: its environment and folder carry over from block to block."""

    env: dict[str, str]
    cwd: Path
    logs: Path
    background: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def run(self, script: str) -> tuple[int, str]:
        state = self.logs / "env"
        full = f'set -eo pipefail\n{script}\nenv -0 > "{state}"\n'
        p = subprocess.run(
            ["bash", "-c", full],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=STEP_TIMEOUT_S,
        )
        if p.returncode == 0:
            pairs = (item.partition("=") for item in state.read_bytes().decode().split("\0"))
            self.env = {k: v for k, _, v in pairs if k}
            self.cwd = Path(self.env["PWD"])
        return p.returncode, p.stdout.decode(errors="replace")

    def start(self, script: str) -> Path:
        log = self.logs / f"background-{len(self.background)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", script],
                env=self.env,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, for the Ctrl-C at the end
            )
        self.background.append((proc, log))
        return log

    def stop_all(self) -> list[str]:
        """Ctrl-C each background process, the last started first; what did not stop."""
        stuck = []
        for proc, log in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    stuck.append(log.name)
        return stuck


def _record(sandbox_port: int, record_id: str) -> dict[str, object]:
    url = f"http://127.0.0.1:{sandbox_port}/_sandbox/records/{record_id}"
    with urllib.request.urlopen(url, timeout=10) as r:
        data: dict[str, object] = json.loads(r.read())
        return data


def _wait_for_output(log: Path, shown: list[str], where: str) -> None:
    def printed() -> str:
        return log.read_text(errors="replace")

    wait_until(
        lambda: missing(printed(), shown) is None,
        RETRY_S,
        lambda: f"{where}\nto show its output; it printed:\n{printed()}",
        interval=0.2,
    )


@pytest.fixture
def session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Session]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CONNECTOR_", "DEMO_")) and k != "DATABASE_URL"
    }
    databases, url = None, None
    if os.environ.get("TEST_DATABASE_URL"):
        databases = request.getfixturevalue("databases")
        url = env["DATABASE_URL"] = databases.new()
    s = Session(env, ROOT, tmp_path)
    try:
        yield s
    finally:
        stuck = s.stop_all()
        if databases is not None and url is not None:
            databases.release(url)
        assert not stuck, f"did not stop on Ctrl-C within 60 s: {stuck}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_tutorial_routes_a_lead_as_written(session: Session) -> None:
    ports = {name: free_port() for name in DOC_PORTS}
    folder = make_embedded_tempdir("tutorial-")  # world-readable: the embedded server as root
    session.env["CONNECTOR_PORT"] = str(ports["connector"])
    session.env["CONNECTOR_ADMIN_PORT"] = str(ports["admin"])
    plan = steps(localized(TUTORIAL.read_text(encoding="utf-8"), ports, folder))
    assert [s.script.strip() for s in plan if s.mode == "not-tested"] == ["python3 dev.py demo"]
    assert {s.mode for s in plan} == set(MODES), "the checker sees every kind of block"

    for n, step in enumerate(plan, 1):
        where = f"sh block {n} ({step.mode}):\n{step.script}"
        if step.mode == "not-tested":
            continue
        if step.mode == "background":
            log = session.start(step.script)
            if step.shown is not None:
                _wait_for_output(log, step.shown, where)
            continue
        deadline = time.monotonic() + (RETRY_S if step.mode == "retry" else 0)
        while True:
            code, output = session.run(step.script)
            gap = missing(output, step.shown) if step.shown is not None else None
            if (code == 0 and gap is None) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        assert code == 0, f"{where}\nexited {code}:\n{output}"
        assert gap is None, f"{where}\ndoes not show {gap!r}; it printed:\n{output}"

    # The end state, read from the simulator itself: both leads have a rep of the config as
    # owner, written by the connector; the person's lead kept its owner.
    reps = {f"005SB000000000{i}YAA" for i in range(1, 7)}
    for record_id in ROUTED:
        assert _record(ports["sandbox"], record_id)["OwnerId"] in reps
    assert _record(ports["sandbox"], PERSONS[0])["OwnerId"] == PERSONS[1]
