"""requirements.lock pins every dependency of pyproject.toml (runtime and the dev extra) and
everything they pull in, in a form pip takes as constraints; dev.py and the Dockerfile install
from it. A dependency added to pyproject.toml without `python3 dev.py lock` fails here."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(\s*;\s*(.+))?$")
FIX = "run `python3 dev.py lock` and commit requirements.lock"


def pins(text: str) -> dict[str, Version]:
    """name -> pinned version; every line that is not a comment must be ``name==version``
    (with an optional marker): no extras, ranges, URLs or options, which ``-c`` refuses."""
    found: dict[str, Version] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = PIN.match(line)
        assert m, f"requirements.lock: not a pin: {line!r}"
        found[canonicalize_name(m.group(1))] = Version(m.group(2))
    return found


def declared() -> list[Requirement]:
    """pyproject.toml's dependencies and its dev extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [
        Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    ]


def missing_or_outside(requirements: list[Requirement], pinned: dict[str, Version]) -> list[str]:
    """The requirements (for this platform) that the pins leave out or do not satisfy."""
    env = default_environment()
    problems = []
    for req in requirements:
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in pinned:
            problems.append(f"{req} is not pinned")
        elif not req.specifier.contains(pinned[name], prereleases=True):
            problems.append(f"{req}: the lock pins {pinned[name]}")
    return problems


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    problems = missing_or_outside(declared(), pins(LOCK.read_text()))
    assert not problems, f"{problems}: {FIX}"


def test_a_dependency_missing_from_the_lock_is_caught() -> None:
    pinned = pins(LOCK.read_text())
    assert missing_or_outside([Requirement("no-such-package-here>=3")], pinned) == [
        "no-such-package-here>=3 is not pinned"
    ]
    assert missing_or_outside([Requirement("SQLAlchemy>=99")], pinned) == [
        f"SQLAlchemy>=99: the lock pins {pinned['sqlalchemy']}"
    ]


def test_everything_installed_for_the_project_is_pinned() -> None:
    """The dependencies of the dependencies too, as installed in this environment (a lock
    written before a new transitive dependency appeared would miss it)."""
    pinned = pins(LOCK.read_text())
    env = default_environment()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(r, "") for r in declared()]
    unpinned = []
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if name not in pinned:
            unpinned.append(name)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for extra_name in req.extras or {""}:
            todo += [(Requirement(r), extra_name) for r in requires]
    assert len({name for name, _ in seen}) > 40  # the walk went past the direct dependencies
    assert not unpinned, f"installed but not in the lock: {sorted(unpinned)}: {FIX}"


def _dev_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dev_py_installs_from_the_lock_and_writes_it_in_the_form_checked_here() -> None:
    dev = _dev_py()
    install = dev.install_command()
    assert install[install.index("-c") + 1] == str(LOCK)
    assert install[-2:] == ["-e", f"{ROOT}[dev]"]
    lock = dev.lock_command(["--upgrade"])
    assert lock[0].endswith("pip-compile") and lock[-1] == "--upgrade"
    assert {"--extra", "dev", "--strip-extras", "--no-emit-index-url"} <= set(lock)
    assert lock[lock.index("--output-file") + 1] == "requirements.lock"
    assert "python3 dev.py lock" in LOCK.read_text()  # the header names the command
