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
a line matches any text. A ```` ```text background ```` block after a command block is what
the last started background terminal (the connector's) prints meanwhile: it must show it
within a minute.

Where the tutorial says to stop its terminals with Ctrl-C, a ``<!-- test: ctrl-c -->`` line
(invisible on the rendered page) makes the test do it: first it reads the end state from
each simulator still running (the records the tutorial routed have a rep as owner, written
by the connector; the one a person owns kept its owner), then SIGINT to every background
process, the last started first; each must stop within a minute without a traceback.

Three things are changed, to let test runs share a machine and to test this checkout: the
ports 8900, 8901, 8080 and 9100 become free ones (the connector takes its default ports from
``CONNECTOR_PORT`` and ``CONNECTOR_ADMIN_PORT``, set to those), the folder ``/tmp/tutorial``
becomes a new one, and the commands run this checkout's code (``PYTHONPATH``; the ``connector``
script of the interpreter running the tests stands in when the checkout has no ``.venv``,
as in a git worktree). With ``TEST_DATABASE_URL`` the connector uses a fresh database of that
server (``DATABASE_URL``); otherwise the tutorial's own embedded PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from connector.shell.embedded_pg import make_embedded_tempdir
from testbed.waiting import wait_until
from tests.helpers import curl
from tests.helpers.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
# A fenced block, or the Ctrl-C marker line (an HTML comment: not shown on the page).
BLOCK = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$|^<!-- test: (ctrl-c) -->[ \t]*$", re.S | re.M)
DOC_PORTS = {"salesforce": 8900, "hubspot": 8901, "connector": 8080, "admin": 9100}
DOC_FOLDER = "/tmp/tutorial"
MODES = ("run", "background", "retry", "not-tested")
CTRL_C = "ctrl-c"  # the mode of the step a marker line makes
RETRY_S = 60.0
STEP_TIMEOUT_S = 240.0
SANDBOX = re.compile(r"connector sandbox (salesforce|hubspot) --port (\d+)")

# The records each half of the tutorial creates: two to route, one a person owns already
# (Salesforce: Ada's lead; HubSpot: Katherine's contact). Ids as a fresh simulator gives them.
SF_REPS = {f"005SB000000000{i}YAA" for i in range(1, 7)}
SF_ROUTED = ("00QSB00000000082AA", "00QSB00000000092AA")
SF_PERSONS = ("00QSB00000000102AA", "005SB0000000001YAA")
HS_OWNERS = {"101", "102", "103", "104"}
HS_ROUTED = ("1001", "1002")
HS_PERSONS = ("1003", "102")


@dataclass
class Step:
    mode: str
    script: str
    shown: list[str] | None = None  # the output block after it
    background_shown: list[str] | None = None  # what the connector's terminal shows meanwhile


def steps(text: str) -> list[Step]:
    """The command blocks and Ctrl-C markers of the doc, each command block with the output
    blocks that follow it."""
    out: list[Step] = []
    for m in BLOCK.finditer(text):
        if m.group(3):
            out.append(Step(CTRL_C, ""))
            continue
        info, body = m.group(1).split(), m.group(2)
        if info[:1] == ["sh"]:
            mode = info[1] if len(info) > 1 else "run"
            assert mode in MODES, f"unknown mode {mode!r} of a sh block"
            out.append(Step(mode, body))
        elif info == ["text"]:
            assert out and out[-1].mode != CTRL_C and out[-1].shown is None, (
                "a text block shows the output of a sh block"
            )
            out[-1].shown = body.splitlines()
        elif info == ["text", "background"]:
            assert out and out[-1].mode not in (CTRL_C, "background"), (
                "a text background block shows what a background terminal prints meanwhile"
            )
            assert out[-1].background_shown is None
            out[-1].background_shown = body.splitlines()
        else:
            assert info[:1] != ["text"], f"unknown text block {info!r}"
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


def test_steps_reads_blocks_outputs_and_markers() -> None:
    doc = (
        "```sh\necho a\n```\n\n```text\na\n```\n\n```text background\nb\n```\n"
        "prose\n<!-- test: ctrl-c -->\n```sh retry\ntrue\n```\n```yaml\nk: v\n```\n"
    )
    assert steps(doc) == [
        Step("run", "echo a\n", ["a"], ["b"]),
        Step(CTRL_C, ""),
        Step("retry", "true\n"),
    ]
    with pytest.raises(AssertionError, match="unknown text block"):
        steps("```sh\ntrue\n```\n```text stderr\nx\n```\n")


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
    folder: Path  # the tutorial's /tmp/tutorial
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

    def running(self) -> list[tuple[str, Path]]:
        """The background processes still running: (their script, their log)."""
        return [(p.args[-1], log) for p, log in self.background if p.poll() is None]

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


def _owner(kind: str, sandbox_port: int, record_id: str) -> object:
    """A record's owner, as the simulator holds it."""
    url = f"http://127.0.0.1:{sandbox_port}/_sandbox/records/{record_id}"
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.loads(r.read())
    return data["OwnerId"] if kind == "salesforce" else data["properties"]["hubspot_owner_id"]


def check_end_state(kind: str, sandbox_port: int) -> None:
    """The routed records have a rep of the config as owner, written by the connector; the
    person's record kept its owner."""
    reps, routed, (person, theirs) = {
        "salesforce": (SF_REPS, SF_ROUTED, SF_PERSONS),
        "hubspot": (HS_OWNERS, HS_ROUTED, HS_PERSONS),
    }[kind]
    for record_id in routed:
        owner = _owner(kind, sandbox_port, record_id)
        assert owner in reps, f"{kind} record {record_id}: owner {owner!r}, not a rep"
    assert _owner(kind, sandbox_port, person) == theirs, f"{kind}: the person's record moved"


def ctrl_c(session: Session) -> set[str]:
    """What a reader's Ctrl-C in each terminal does, after reading each running simulator's
    end state; the kinds of simulator checked."""
    checked = set()
    for script, _ in session.running():
        if m := SANDBOX.search(script):
            check_end_state(m.group(1), int(m.group(2)))
            checked.add(m.group(1))
    logs = session.running()
    stuck = session.stop_all()
    assert not stuck, f"did not stop on Ctrl-C within 60 s: {stuck}"
    for script, log in logs:
        printed = log.read_text(errors="replace")
        assert "Traceback" not in printed, f"Ctrl-C of {script!r} printed:\n{printed}"
    return checked


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
        if not k.startswith(("CONNECTOR_", "DEMO_"))
        # a reader's shell has neither; PYTHONUNBUFFERED would hide output written out of order
        and k not in ("DATABASE_URL", "PYTHONUNBUFFERED")
    }
    databases, url = None, None
    if os.environ.get("TEST_DATABASE_URL"):
        databases = request.getfixturevalue("databases")
        url = env["DATABASE_URL"] = databases.new()
    # This checkout's code, whichever installation's `connector` script runs it.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [env.get("PATH"), str(Path(sys.executable).parent)]))
    if curl.install_if_missing(tmp_path / "bin"):  # a machine with only Python
        env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), env["PATH"]])
    # world-readable: the embedded server as root
    s = Session(env, ROOT, tmp_path, make_embedded_tempdir("tutorial-"))
    try:
        yield s
    finally:
        stuck = s.stop_all()
        shutil.rmtree(s.folder, ignore_errors=True)  # the tutorial's cleanup, when it failed
        if databases is not None and url is not None:
            databases.release(url)
        assert not stuck, f"did not stop on Ctrl-C within 60 s: {stuck}"


@pytest.mark.slow
@pytest.mark.db  # on TEST_DATABASE_URL's server when set (CI's second pass: -m "db and ...")
def test_the_tutorial_routes_a_lead_as_written(session: Session) -> None:
    ports = {name: free_port() for name in DOC_PORTS}
    session.env["CONNECTOR_PORT"] = str(ports["connector"])
    session.env["CONNECTOR_ADMIN_PORT"] = str(ports["admin"])
    plan = steps(localized(TUTORIAL.read_text(encoding="utf-8"), ports, session.folder))
    assert [s.script.strip() for s in plan if s.mode == "not-tested"] == ["python3 dev.py demo"]
    assert {s.mode for s in plan} == {*MODES, CTRL_C}, "the checker sees every kind of block"
    assert any(s.background_shown for s in plan), "and every kind of output block"

    checked: set[str] = set()
    for n, step in enumerate(plan, 1):
        where = f"step {n} ({step.mode}):\n{step.script}"
        if step.mode == "not-tested":
            continue
        if step.mode == CTRL_C:
            checked |= ctrl_c(session)
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
        if step.background_shown is not None:
            running = session.running()
            assert running, f"{where}\nno background terminal shows what it should"
            _wait_for_output(running[-1][1], step.background_shown, f"{where}\n{running[-1][0]}")

    # Each half stopped its simulator with Ctrl-C after the end state was read from it.
    assert checked == {"salesforce", "hubspot"}
    assert not session.running(), "the tutorial ends with every terminal stopped"
    assert not session.folder.exists(), "and removes its folder"
