"""The Docker image, without a Docker engine: the file set docker/Dockerfile copies, installed
with the Dockerfile's own pip arguments (from requirements.lock) into a fresh virtualenv as a
non-root user, runs the commands the image ships: `migrate`, `check-config --online` and `run`
against the CRM sandboxes (a lead routed, the image's HEALTHCHECK passing with the admin
token), `sandbox`, and a one-line refusal where the image has no database.

As root the test runs as the user `tester` (created when missing, like the image's own user:
a system user without a home); as anyone else, as that user."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from connector.shell.demo_world import ENV
from testbed.pg import memory_dir
from testbed.waiting import wait_until
from tests.helpers.faults import TwoOrgs
from tests.helpers.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
CONTEXT = ROOT  # compose.yaml: `context: ..`, so the build context is the repository root
USER = "tester"
TOKEN = "image-test-admin-token-0123456789"
IGNORED = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")


# --- reading the Dockerfile (pure) ----------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def copies(steps: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """Each COPY's sources (relative to the build context) and destination."""
    found = []
    for word, rest in steps:
        if word == "COPY":
            parts = shlex.split(rest)
            assert not any(p.startswith("--") for p in parts), f"COPY option not handled: {rest}"
            found.append((parts[:-1], parts[-1]))
    return found


def pip_install_args(steps: list[tuple[str, str]]) -> list[str]:
    """The arguments of the one `pip install` in the RUN lines."""
    runs = [rest for word, rest in steps if word == "RUN" and "pip install" in rest]
    assert len(runs) == 1, runs
    command = runs[0].split("&&")[0]
    words = shlex.split(command)
    return words[words.index("install") + 1 :]


def healthcheck(steps: list[tuple[str, str]]) -> list[str]:
    """The HEALTHCHECK's command (exec form)."""
    (rest,) = [rest for word, rest in steps if word == "HEALTHCHECK"]
    command: list[str] = json.loads(rest[rest.index("CMD") + 3 :])
    return command


def env(steps: list[tuple[str, str]]) -> dict[str, str]:
    """The ENV instructions' NAME=value pairs."""
    found: dict[str, str] = {}
    for word, rest in steps:
        if word == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                found[name] = value
    return found


STEPS = instructions(DOCKERFILE.read_text())


def test_the_image_copies_every_package_the_wheel_ships_and_the_lock() -> None:
    copied = {src.rstrip("/") for sources, _ in copies(STEPS) for src in sources}
    # pyproject: [tool.setuptools.packages.find] include = connector*, crm_adapters*, ...
    assert {"connector", "crm_adapters", "crm_sandboxes", "db"} <= copied
    assert {"pyproject.toml", "README.md", "requirements.lock"} <= copied
    for src in copied:
        assert (CONTEXT / src).exists(), src
    args = pip_install_args(STEPS)
    assert args[args.index("-c") + 1] == "requirements.lock"
    assert healthcheck(STEPS)[:3] == ["python", "-m", "connector.shell.healthcheck"]
    assert env(STEPS)["CONNECTOR_ADMIN_PORT"] == "9100"


def test_the_parser_joins_lines_and_drops_comments() -> None:
    steps = instructions(
        "FROM x\n# a comment\nCOPY a b ./\nRUN pip install -c l.txt . \\\n"
        "    && useradd u\nENV A=1 \\\n    B=two\n"
    )
    assert steps[0] == ("FROM", "x")
    assert copies(steps) == [(["a", "b"], "./")]
    assert pip_install_args(steps) == ["-c", "l.txt", "."]
    assert env(steps) == {"A": "1", "B": "two"}


# --- the file set, installed and run as a non-root user -----------------------------------


@dataclass
class Account:
    name: str
    uid: int
    gid: int


def _non_root_account() -> Account:
    """This process's user when it is not root; as root, `tester` (made when missing)."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return Account(me.pw_name, me.pw_uid, me.pw_gid)
    try:
        found = pwd.getpwnam(USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", USER],
            capture_output=True,
            text=True,
        )
        if made.returncode not in (0, 9):  # 9: made meanwhile by another worker
            pytest.skip(f"cannot create the non-root user {USER!r}: {made.stderr.strip()}")
        found = pwd.getpwnam(USER)
    return Account(found.pw_name, found.pw_uid, found.pw_gid)


def _as(account: Account) -> dict[str, object]:
    if os.geteuid() != 0:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": []}


def _runs(account: Account, cmd: list[str]) -> bool:
    """Whether ``cmd`` exits 0 when ``account`` runs it."""
    try:
        done = subprocess.run(cmd, capture_output=True, **_as(account))  # type: ignore[arg-type]
    except OSError:  # e.g. under a folder the account may not enter
        return False
    return done.returncode == 0


def _python_for(account: Account) -> str:
    """A Python 3.11+ with venv that ``account`` can run (root's own may sit under /root,
    0700): the one running the tests, else the system's."""
    candidates = [
        getattr(sys, "_base_executable", sys.executable),
        shutil.which("python3.11"),
        "/usr/local/bin/python3",
        "/usr/bin/python3.11",
        "/usr/bin/python3",
    ]
    check = "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"
    for python in dict.fromkeys(c for c in candidates if c):
        if _runs(account, [python, "-c", check]):
            return python
    pytest.skip(f"no Python 3.11+ with venv and ensurepip that {account.name} can run")


def python_in(app: Path) -> str:
    return str(app / "venv" / "bin" / "python")


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[Path, Account, dict[str, str]]]:
    """(the image's /app: the copied files and ./venv, the account, the image's ENV)."""
    account = _non_root_account()
    python = _python_for(account)
    app = Path(tempfile.mkdtemp(prefix="lrc-image-", dir=memory_dir()))  # tmpfs: quicker
    try:
        app.chmod(0o755)
        for sources, dest in copies(STEPS):
            for src in sources:
                source = CONTEXT / src
                target = app / dest / source.name if dest.endswith("/") else app / dest
                if source.is_dir():
                    shutil.copytree(source, target, ignore=IGNORED)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target)
        if os.geteuid() == 0:
            for path in [app, *app.rglob("*")]:
                os.chown(path, account.uid, account.gid, follow_symlinks=False)
        # pip's cache survives the run (a dir of this user's own), so a later run downloads
        # nothing; the install itself is done afresh every time.
        cache = Path(tempfile.gettempdir()) / f"lrc-image-test-pip-{account.uid}"
        cache.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(cache, account.uid, account.gid)
        install_env = {
            **{k: v for k, v in os.environ.items() if k.startswith(("PIP_", "SSL_", "REQUESTS_"))},
            "PATH": f"{app / 'venv' / 'bin'}:/usr/bin:/bin",
            "HOME": str(app),
            "PIP_CACHE_DIR": str(cache),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }
        # A venv without pip, filled by the interpreter's own pip (`--python`, pip 22.3+),
        # when it has one: ensurepip's copy of pip cost 3.5 s of CPU of the test's ~14.
        has_pip = _runs(account, [python, "-m", "pip", "--python", python, "--version"])
        venv = [python, "-m", "venv", *([] if not has_pip else ["--without-pip"]), "venv"]
        pip = (
            [python, "-m", "pip", "--python", python_in(app)]
            if has_pip
            else [python_in(app), "-m", "pip"]
        )
        for cmd in (
            venv,
            [
                *pip,
                "install",
                "-q",
                # the .pyc of every installed module (hubspot-api-client alone has thousands)
                # cost more than the rest of the test; the commands below write those of the
                # modules they import instead
                "--no-compile",
                *pip_install_args(STEPS),
            ],
        ):
            done = subprocess.run(
                cmd,
                cwd=app,
                env=install_env,
                capture_output=True,
                text=True,
                timeout=600,
                **_as(account),  # type: ignore[arg-type]
            )
            assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]} {done.stderr[-3000:]}"
        image_env = {
            **{k: v for k, v in env(STEPS).items() if k != "PYTHONDONTWRITEBYTECODE"},
            **ENV,
            "PATH": f"{app / 'venv' / 'bin'}:/usr/bin:/bin",
            "HOME": "/nonexistent",  # the image's user has no home
            "CONNECTOR_HOST": "127.0.0.1",  # tests listen on loopback only
        }
        yield app, account, image_env
    finally:
        shutil.rmtree(app, ignore_errors=True)


def _run(
    image: tuple[Path, Account, dict[str, str]], args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    _, account, _ = image
    return subprocess.run(
        args,
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        **_as(account),  # type: ignore[arg-type]
    )


@pytest.mark.slow
def test_the_image_runs_its_commands_as_a_non_root_user(
    image: tuple[Path, Account, dict[str, str]], two_orgs: TwoOrgs
) -> None:
    """With the database the image's own user starts: the embedded PostgreSQL, its data in a
    folder of that user's (the test server's socket is in a folder only its owner may enter).
    """
    app, account, image_env = image
    config = app / "config"
    shutil.copytree(two_orgs.config_dir, config)
    if os.geteuid() == 0:
        for path in [config, *config.iterdir()]:
            os.chown(path, account.uid, account.gid)
    port, admin_port = free_port(), free_port()
    run_env = {
        **image_env,
        "CONNECTOR_CONFIG": str(config),
        "CONNECTOR_PGDATA": str(app / "pgdata"),
        "CONNECTOR_PORT": str(port),
        "CONNECTOR_ADMIN_PORT": str(admin_port),
        "CONNECTOR_ADMIN_TOKEN": TOKEN,
        "CONNECTOR_LOG_LEVEL": "INFO",
    }
    r = _run(image, ["connector", "migrate"], run_env)
    assert r.returncode == 0, r.stderr
    assert "org demo-sf: 2 teams applied" in r.stdout
    r = _run(image, ["connector", "check-config", "--online"], run_env)
    assert r.returncode == 0, r.stdout + r.stderr

    lead = two_orgs.sf.add_record("Lead", owner_id=two_orgs.intake, fields={"Country": "US"})
    proc = subprocess.Popen(
        ["connector", "run"],
        cwd="/",
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **_as(account),  # type: ignore[arg-type]
    )
    try:
        probe = healthcheck(STEPS)
        wait_until(
            lambda: _run(image, probe, run_env).returncode == 0,
            90,
            "the image's HEALTHCHECK to pass",
            0.2,
        )
        # the admin listener wants the token; the probe sent it
        status = httpx.get(f"http://127.0.0.1:{admin_port}/healthz", timeout=5).status_code
        assert status == 401
        without_token = {k: v for k, v in run_env.items() if k != "CONNECTOR_ADMIN_TOKEN"}
        refused = _run(image, probe, without_token)
        assert (refused.returncode, refused.stderr) == (
            1,
            f"healthcheck: http://127.0.0.1:{admin_port}/healthz answered 401\n",
        )

        def routed() -> bool:
            record = two_orgs.sf.get_record(lead)
            return record is not None and record["OwnerId"] in two_orgs.reps

        wait_until(routed, 90, "the polled lead to be routed and written back", 0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]

    sandbox_port = free_port()
    sandbox = subprocess.Popen(
        ["connector", "sandbox", "salesforce", "--port", str(sandbox_port)],
        cwd="/",
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **_as(account),  # type: ignore[arg-type]
    )
    try:
        url = f"http://127.0.0.1:{sandbox_port}/services/oauth2/token"

        def answers() -> bool:
            try:
                return httpx.post(url, timeout=2).status_code < 500
            except httpx.HTTPError:
                assert sandbox.poll() is None, sandbox.communicate()[1]
                return False

        wait_until(answers, 60, "`connector sandbox salesforce` to answer", 0.1)
    finally:
        sandbox.terminate()
        sandbox.communicate(timeout=30)

    no_db = {k: v for k, v in run_env.items() if k != "CONNECTOR_PGDATA"}
    no_db["CONNECTOR_LOG_LEVEL"] = "WARNING"
    r = _run(image, ["connector", "status", "--org", "demo-sf"], no_db)
    assert r.returncode == 2
    assert r.stderr == (
        "connector: the embedded PostgreSQL cannot keep its data in "
        "/nonexistent/.local/state/lead-routing-connector (Permission denied): set "
        "DATABASE_URL, or CONNECTOR_PGDATA to a writable folder\n"
    )


# --- docker/compose.yaml and its env file ----------------------------------------------------


def test_compose_takes_secrets_from_an_env_file_and_guards_the_admin_port() -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    connector = compose["services"]["connector"]
    assert connector["env_file"] == "connector.env"
    text = (ROOT / "docker" / "compose.yaml").read_text()
    # no org's secret names: those are in the env file, whatever the orgs are called
    assert re.findall(r"\b(?:ACME|GLOBEX|DEMO)_[A-Z_]+", text) == []
    environment = connector["environment"]
    assert environment["CONNECTOR_ADMIN_HOST"] == "0.0.0.0"
    assert environment["CONNECTOR_ADMIN_TOKEN"].startswith("${CONNECTOR_ADMIN_TOKEN:?")
    assert {str(p) for p in connector["ports"]} == {"8080", "9100"}


def test_the_env_file_example_names_every_secret_the_example_configs_reference() -> None:
    example = (ROOT / "docker" / "connector.env.example").read_text()
    names = {line.split("=")[0] for line in example.splitlines() if re.match(r"[A-Z]", line)}
    referenced = {
        n
        for f in (ROOT / "config").glob("*.yaml")
        for n in re.findall(r"\$\{(\w+)\}", f.read_text())
    }
    assert referenced and referenced <= names
    assert {"POSTGRES_PASSWORD", "CONNECTOR_ADMIN_TOKEN"} <= names
