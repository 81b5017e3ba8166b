#!/usr/bin/env python3
"""Bootstrap and run: needs only Python 3.11+; creates .venv and installs the project.

python3 dev.py demo        the main job: a burst of leads routed on an embedded Postgres
python3 dev.py test [ARGS] the whole test suite (ARGS go to pytest), on pytest-xdist workers
                           (cores + 4; one per core with TEST_DATABASE_URL) unless ARGS
                           choose (`-n 0`, `-p no:xdist`) or use --pdb
python3 dev.py lint        ruff (lint + format check) and mypy
python3 dev.py lock [ARGS] rewrite requirements.lock from pyproject.toml (pip-compile: pins
                           kept, new dependencies added; ARGS go to pip-compile, e.g.
                           --upgrade or --upgrade-package NAME), then reinstall .venv
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed"
LOCK = ROOT / "requirements.lock"


def _fingerprint() -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    if LOCK.exists():
        digest.update(LOCK.read_bytes())
    return digest.hexdigest()


def install_command() -> list[str]:
    """The project and its dev tools, at the versions requirements.lock pins (the Dockerfile
    installs from the same lock)."""
    return [
        str(BIN / "python"),
        *("-m", "pip", "install", "--disable-pip-version-check", "-q"),
        *("-c", str(LOCK)),
        *("-e", f"{ROOT}[dev]"),
    ]


def lock_command(args: list[str]) -> list[str]:
    """pip-compile of pyproject.toml's dependencies and dev extra into requirements.lock: one
    ``name==version`` a line (no extras, no index URLs), usable as pip's ``-c`` constraints."""
    return [
        str(BIN / "pip-compile"),
        *("--quiet", "--extra", "dev", "--strip-extras", "--allow-unsafe"),
        *("--no-emit-index-url", "--no-emit-trusted-host", "--no-emit-find-links"),
        *("--output-file", str(LOCK.relative_to(ROOT)), "pyproject.toml"),
        *args,
    ]


def ensure_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script runs under any python3
        sys.exit(f"Python 3.11 or newer is needed (this is {sys.version.split()[0]})")
    if not (BIN / "python").exists():
        print("creating .venv ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if STAMP.exists() and STAMP.read_text() == _fingerprint():
        return
    print("installing the project and its dev tools into .venv ...", file=sys.stderr)
    subprocess.run(install_command(), check=True, cwd=ROOT)
    STAMP.write_text(_fingerprint())


def worker_count() -> int:
    """Four workers more than the cores this process may use: the suite spends much of its
    time waiting on clocks (CRM outages, Retry-After, HTTP deadlines, processes killed and
    restarted), and the extra workers fill the cores meanwhile (how many tests wait does not
    grow with the cores). Measured on 2 cores in one sitting (tests marked slow first, handed
    out one at a time): 4 workers 213 s with the cores 90% busy, 6 workers 198 s with them 97%
    busy."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores + 4


def xdist_args(args: list[str]) -> list[str]:
    """The workers and their schedule, unless the caller picked them, turned xdist off, or
    debugs."""
    chosen = any(
        a.startswith(("-n", "--numprocesses", "--dist", "--pdb", "--trace")) or "no:xdist" in a
        for a in args
    )
    # --dist load: a worker that dies is replaced and the run goes on (loadscope/loadgroup
    # stop with an INTERNALERROR when a replaced worker gets work: pytest-xdist 3.8).
    # --maxschedchunk 1: each worker holds its running test and one more, and gets the next when
    # one ends, so the slow ones (collected first, tests/conftest.py) spread over the workers
    # instead of all landing in the first worker's initial block of consecutive tests.
    if chosen:
        return []
    if os.environ.get("TEST_DATABASE_URL"):
        # A shared server has a connection limit (PostgreSQL's default: 100), and the
        # 32-process tests open a connection per process, so these run one worker per core
        # and in blocks, which keeps the slow tests on one worker, one after another (spread over
        # 4 workers, 8 tests failed with "too many clients already").
        return ["-n", "auto", "--dist", "load"]
    return ["-n", str(worker_count()), "--dist", "load", "--maxschedchunk", "1"]


def bytecode_env() -> dict[str, str]:
    """The environment for the test run: bytecode is written, under .venv/pycache.

    With PYTHONDONTWRITEBYTECODE set (as on this project's CI machines) each xdist worker
    re-did pytest's assertion rewriting of every test module (7.3 s of collection instead of
    2.8 s, in each worker) and each of the ~140 connector processes the tests start compiled
    the project afresh. The cache goes under .venv (PYTHONPYCACHEPREFIX), so the source tree
    still gets no __pycache__ folders; a PYTHONPYCACHEPREFIX the caller set is kept.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(VENV / "pycache"))
    return env


def run(cmd: list[str], env: dict[str, str] | None = None) -> int:
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "lint", "lock"):
        print(__doc__, file=sys.stderr)
        return 2
    ensure_venv()
    what, rest = argv[0], argv[1:]
    if what == "demo":
        return run([str(BIN / "connector"), "demo", *rest])
    if what == "lock":
        env = {**os.environ, "CUSTOM_COMPILE_COMMAND": "python3 dev.py lock"}
        code = run(lock_command(rest), env)
        if code == 0:
            ensure_venv()  # the new lock changes the fingerprint: install what it pins
        return code
    if what == "lint":
        checks = (
            ["ruff", "check", "."],
            ["ruff", "format", "--check", "."],
            ["mypy"],
            ["lint-imports"],
        )
        for cmd in checks:
            code = run([str(BIN / cmd[0]), *cmd[1:]])
            if code:
                return code
        return 0
    code = run([str(BIN / "python"), "-m", "pytest", *xdist_args(rest), *rest], bytecode_env())
    if code == 5:  # pytest collected no tests: that is a failure, not a pass
        print("dev.py: pytest ran no tests", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
