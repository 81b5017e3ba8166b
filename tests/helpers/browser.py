"""A headless Chromium and its chromedriver for the browser tests: found, or fetched from the
package registries.

Where the browser comes from, first that works:

1. ``chromium`` (or ``chromium-browser``) and ``chromedriver`` on PATH: Debian's packages, as
   CI installs them.
2. The registries' build, for Linux on x86_64: Chromium from the npm registry's
   ``@sparticuz/chromium`` (a headless shell built to run with the libraries it carries) and
   the chromedriver of the same Chromium version from PyPI's ``chromedriver-py`` wheel. Both
   are pinned here with their digests, fetched once (the npm registry over HTTPS, the wheel
   with pip, so pip's own index settings apply) and unpacked into the user's cache
   (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``lead-routing-connector/browser``). This needs
   neither root nor any site but the two registries, so a new machine with only Python runs
   the browser tests too. ``npm_config_registry`` (npm's own setting, any case) names another
   npm registry. Under the fetch's lock, what an interrupted fetch left and the builds of
   other pinned versions are removed.
3. Chrome for Testing from Selenium Manager (part of Selenium), which needs the internet.

A build that does not start here (``--version``: a minimal container may lack the GLib, XCB and
D-Bus libraries chromedriver needs) counts as none. When none works, ``find_browser`` says why
each failed. A download whose digest differs from
the pinned one is refused and nothing of it is kept.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

# The npm registry's package: Chromium 153.0.8010.0 (bin/chromium.br), the libraries it needs
# beside the C library (bin/al2023.tar.br: NSS, NSPR, expat), SwiftShader and a font.
CHROMIUM_PACKAGE = "@sparticuz/chromium"
CHROMIUM_VERSION = "153.0.0"
CHROMIUM_SHA512 = (
    "jiGWqSvPMdu4+P9TilYqAR7yEGPEHINx+lCvE/NqNO/EHYzF/x1hUiI5T6ioVIt7dEy7n88byyT0vk+dnsgQwA=="
)
# PyPI's chromedriver for the same Chromium (153.0.8010): a driver works with its own major.
DRIVER_PACKAGE = "chromedriver-py"
DRIVER_VERSION = "153.0.8010.52"
DRIVER_WHEEL = f"chromedriver_py-{DRIVER_VERSION}-py3-none-any.whl"
DRIVER_SHA256 = "5c481f51b1fbb72bdaf3484c091d70b99328f5530828d01b2782039e2429cb71"
DRIVER_MEMBER = "chromedriver_py/chromedriver_linux64"

# Bumped when the unpacked folder's layout changes, so an older layout is never read.
LAYOUT = 1
NPM_REGISTRY = "https://registry.npmjs.org"
FETCH_TIMEOUT = 120  # seconds without a byte before a download is given up
CHUNK = 1 << 20

Fetch = Callable[[str, Path], None]


class DigestMismatch(Exception):
    """A download is not the pinned file."""


@dataclass(frozen=True)
class Browser:
    binary: str
    driver: str
    # added to chromedriver's environment (the browser it starts inherits it)
    env: Mapping[str, str] = field(default_factory=dict)


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "lead-routing-connector" / "browser"


def build_dir(root: Path) -> Path:
    return root / f"chromium-{CHROMIUM_VERSION}-driver-{DRIVER_VERSION}-layout-{LAYOUT}"


def registry_supported() -> str | None:
    """None when the registries' build runs here, else why not."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the registries' build is for Linux on x86_64, not {sys.platform} on " + (
            platform.machine() or "an unknown machine"
        )
    return None


def verify_digest(path: Path, algorithm: str, expected: str, what: str) -> None:
    """Raise DigestMismatch unless ``path`` hashes to ``expected`` (hex for sha256, base64 for
    sha512, as npm's integrity field gives it)."""
    h = hashlib.new(algorithm)
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    got = h.hexdigest() if algorithm == "sha256" else base64.b64encode(h.digest()).decode()
    if got != expected:
        raise DigestMismatch(f"{what}: {algorithm} {got}, expected {expected}")


def browser_in(folder: Path) -> Browser:
    return Browser(
        str(folder / "chromium"),
        str(folder / "chromedriver"),
        {
            "LD_LIBRARY_PATH": str(folder / "lib"),
            "FONTCONFIG_FILE": str(folder / "fonts.conf"),
        },
    )


def npm_fetch(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as r, dest.open("wb") as f:
        shutil.copyfileobj(r, f, CHUNK)
        expected = r.headers.get("Content-Length")
        if expected is not None and f.tell() != int(expected):
            raise OSError(f"{url}: the download stopped at {f.tell()} of {expected} bytes")


def pip_fetch(requirement: str, dest_dir: Path) -> None:
    """The wheel through pip (its index, proxy and certificate settings apply)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(dest_dir),
            requirement,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=FETCH_TIMEOUT * 5,
    )


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One fetch at a time per cache (pytest-xdist workers may all want the browser)."""
    with (root / ".lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _unbrotli(src: io.BufferedIOBase, dest: io.BufferedIOBase) -> None:
    import brotli

    d = brotli.Decompressor()
    try:
        while chunk := src.read(CHUNK):
            dest.write(d.process(chunk))
    except brotli.error as exc:
        raise ValueError(f"corrupt brotli stream: {exc}") from exc
    if not d.is_finished():
        raise ValueError("truncated brotli stream")


def _untar_brotli(src: io.BufferedIOBase, dest: Path, flat: bool = False) -> None:
    """A brotli-compressed tar's regular files into ``dest`` (``flat``: without their
    folders). Anything else (a link, a device, a path out of ``dest``) is refused: written
    here rather than by tarfile's extraction filters, which Python 3.11 has only from 3.11.4."""
    buf = io.BytesIO()
    _unbrotli(src, buf)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as t:
        for m in t.getmembers():
            if m.isdir():
                continue
            parts = Path(m.name).parts
            if not m.isfile() or not parts or m.name.startswith("/") or ".." in parts:
                raise ValueError(f"refused archive member {m.name!r}")
            target = dest / parts[-1] if flat else dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            f = t.extractfile(m)
            if f is None:
                raise ValueError(f"refused archive member {m.name!r}")
            with f, target.open("wb") as out:
                shutil.copyfileobj(f, out, CHUNK)


def unpack(tgz: Path, wheel: Path, folder: Path, final: Path) -> None:
    """The browser, its libraries and font from the npm tarball and the driver from the wheel,
    into ``folder``, laid out as ``browser_in`` reads it once ``folder`` is moved to ``final``
    (the font configuration names its folders by their final paths)."""
    (folder / "lib").mkdir(parents=True)
    with tarfile.open(tgz, "r|gz") as t:  # a stream: each member read once, in order
        for m in t:
            f = t.extractfile(m) if m.isfile() else None
            if f is None:
                continue
            name = m.name.removeprefix("package/")
            if name == "bin/chromium.br":
                with (folder / "chromium").open("wb") as out:
                    _unbrotli(f, out)  # type: ignore[arg-type]
            elif name in ("bin/al2023.tar.br", "bin/swiftshader.tar.br"):
                _untar_brotli(f, folder / "lib", flat=True)  # type: ignore[arg-type]
            elif name == "bin/fonts.tar.br":
                _untar_brotli(f, folder / "fonts")  # type: ignore[arg-type]
    if not (folder / "chromium").exists():
        raise ValueError(f"{CHROMIUM_PACKAGE} {CHROMIUM_VERSION} has no bin/chromium.br")
    with (
        zipfile.ZipFile(wheel) as z,
        z.open(DRIVER_MEMBER) as src,
        (folder / "chromedriver").open("wb") as out,
    ):
        shutil.copyfileobj(src, out, CHUNK)
    for exe in ("chromium", "chromedriver"):
        (folder / exe).chmod(0o755)
    (folder / "fonts.conf").write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
        f"  <dir>{escape(str(final / 'fonts'))}</dir>\n"
        f"  <cachedir>{escape(str(final / 'fonts-cache'))}</cachedir>\n</fontconfig>\n"
    )


def registry_build(
    root: Path, npm: Fetch | None = None, pip: Fetch | None = None, registry: str | None = None
) -> Browser:
    """The registries' build in ``root``, fetched and unpacked the first time (``npm`` and
    ``pip`` fetch a URL and a requirement; the module's own functions by default)."""
    npm = npm or npm_fetch
    pip = pip or pip_fetch
    folder = build_dir(root)
    if _complete(folder):
        return browser_in(folder)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        if _complete(folder):  # another worker fetched it while this one waited
            return browser_in(folder)
        _drop_stale(root, keep=folder)
        if folder.exists():  # not complete: never read a damaged build
            shutil.rmtree(folder)
        with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
            work = Path(tmp)
            tgz = work / "chromium.tgz"
            base = (registry or _npm_registry_setting() or NPM_REGISTRY).rstrip("/")
            name = CHROMIUM_PACKAGE.split("/")[-1]
            npm(f"{base}/{CHROMIUM_PACKAGE}/-/{name}-{CHROMIUM_VERSION}.tgz", tgz)
            verify_digest(tgz, "sha512", CHROMIUM_SHA512, f"{CHROMIUM_PACKAGE} {CHROMIUM_VERSION}")
            pip(f"{DRIVER_PACKAGE}=={DRIVER_VERSION}", work)
            wheel = work / DRIVER_WHEEL
            verify_digest(wheel, "sha256", DRIVER_SHA256, f"{DRIVER_PACKAGE} {DRIVER_VERSION}")
            unpacked = work / "build"
            unpack(tgz, wheel, unpacked, folder)
            unpacked.rename(folder)  # complete, or not there at all
    return browser_in(folder)


def _npm_registry_setting() -> str | None:
    """npm's own setting, as npm reads it from the environment (any case of the name)."""
    for name, value in os.environ.items():
        if name.lower() == "npm_config_registry" and value:
            return value
    return None


def _complete(folder: Path) -> bool:
    return (folder / "chromium").is_file() and (folder / "chromedriver").is_file()


def _drop_stale(root: Path, keep: Path) -> None:
    """Under the lock: what an interrupted fetch left (``.fetch-*``) and the builds of other
    versions or layouts (a checkout of another version sharing the cache fetches its own
    again)."""
    for p in root.iterdir():
        if (
            p != keep
            and p.is_dir()
            and (p.name.startswith(".fetch-") or p.name.startswith("chromium-"))
        ):
            shutil.rmtree(p, ignore_errors=True)


def _on_path() -> Browser | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return Browser(chromium, driver) if chromium and driver else None


def _selenium_manager() -> Browser | str:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    try:
        found = SeleniumManager().binary_paths(["--browser", "chrome", "--avoid-stats"])
    except WebDriverException as exc:  # offline, or no build for this platform
        return f"Selenium Manager could not fetch Chrome for Testing: {exc.msg}"
    return Browser(found["browser_path"], found["driver_path"])


def does_not_start(found: Browser) -> str | None:
    """None when the browser and its driver both start here (``--version``), else why not:
    the registries' build carries the browser's libraries, but its chromedriver needs the
    machine's GLib, XCB and D-Bus, which a minimal container may lack."""
    for exe in (found.driver, found.binary):
        try:
            ran = subprocess.run(
                [exe, "--version"],
                env={**os.environ, **found.env},
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{Path(exe).name} does not start here: {type(exc).__name__}: {exc}"
        if ran.returncode != 0:
            said = (ran.stderr.strip() or ran.stdout.strip()).splitlines()
            return f"{Path(exe).name} does not start here: {said[-1] if said else ran.returncode}"
    return None


def find_browser(root: Path | None = None) -> Browser | str:
    """The browser and its driver, or why there is none (see the module's docstring)."""
    found = _on_path()
    if found is not None:
        return found
    reasons = ["no Chromium and chromedriver on PATH (apt-get install chromium chromium-driver)"]
    unsupported = registry_supported()
    if unsupported is None:
        try:
            built = registry_build(root or cache_root())
            why_not = does_not_start(built)
            if why_not is None:
                return built
            reasons.append(why_not)
        except subprocess.CalledProcessError as exc:
            reasons.append(f"pip could not fetch {DRIVER_PACKAGE}: {exc.stderr.strip()[-300:]}")
        except Exception as exc:  # a failed fetch is a reason to fall back, never a crash
            reasons.append(
                f"the registries' build could not be fetched: {type(exc).__name__}: {exc}"
            )
    else:
        reasons.append(unsupported)
    manager = _selenium_manager()
    if isinstance(manager, Browser):
        return manager
    reasons.append(manager)
    return "; ".join(reasons)


if __name__ == "__main__":  # python -m tests.helpers.browser: fetch now, print what was found
    result = find_browser()
    print(result)
    sys.exit(0 if isinstance(result, Browser) else 1)
