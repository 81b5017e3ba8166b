"""tests/helpers/browser.py: the browser tests' Chromium, found on PATH or fetched from the package
registries into the user's cache.

Synthetic archives (laid out as the npm package and the PyPI wheel are, with the pinned digests
patched to theirs) check what is verified, unpacked, kept and reused; a download that is not
the pinned file, or does not unpack, leaves nothing behind. The last test fetches the real,
pinned build and renders a page with it."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import os
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Literal

import brotli
import pytest

from tests.helpers import browser
from tests.helpers.browser import Browser, DigestMismatch, build_dir, registry_build

CHROMIUM = b"#!/bin/sh\necho chromium\n"
DRIVER = b"#!/bin/sh\necho chromedriver\n"


def _tar(files: dict[str, bytes], mode: Literal["w", "w:gz"] = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def npm_tarball(chromium_br: bytes | None = None, libs_tar: bytes | None = None) -> bytes:
    """A package laid out as @sparticuz/chromium's: package/bin/*.br."""
    chromium = brotli.compress(CHROMIUM) if chromium_br is None else chromium_br
    libs = _tar({"lib/libnss3.so": b"nss"}) if libs_tar is None else libs_tar
    members = {
        "package/package.json": b"{}",
        "package/bin/chromium.br": chromium,
        "package/bin/al2023.tar.br": brotli.compress(libs),
        "package/bin/swiftshader.tar.br": brotli.compress(_tar({"libEGL.so": b"egl"})),
        "package/bin/fonts.tar.br": brotli.compress(
            _tar({"fonts.conf": b"theirs", "fonts/Open_Sans/OpenSans-Regular.ttf": b"ttf"})
        ),
    }
    return _tar(members, "w:gz")


def driver_wheel(driver: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("chromedriver_py/__init__.py", "")
        z.writestr(browser.DRIVER_MEMBER, DRIVER if driver is None else driver.encode())
    return buf.getvalue()


class Registries:
    """Fake npm and pip fetches serving given bytes, counting the calls."""

    def __init__(self, tarball: bytes, wheel: bytes) -> None:
        self.tarball, self.wheel = tarball, wheel
        self.urls: list[str] = []
        self.requirements: list[str] = []

    def npm(self, url: str, dest: Path) -> None:
        self.urls.append(url)
        dest.write_bytes(self.tarball)

    def pip(self, requirement: str, dest_dir: Path) -> None:
        self.requirements.append(requirement)
        (dest_dir / browser.DRIVER_WHEEL).write_bytes(self.wheel)

    @property
    def fetches(self) -> tuple[browser.Fetch, browser.Fetch]:
        return self.npm, self.pip


def pin(
    monkeypatch: pytest.MonkeyPatch, tarball: bytes | None = None, wheel: bytes | None = None
) -> Registries:
    """Make these archives (the synthetic ones by default) the pinned ones; registries that
    serve them."""
    tarball = npm_tarball() if tarball is None else tarball
    wheel = driver_wheel() if wheel is None else wheel
    monkeypatch.setattr(
        browser, "CHROMIUM_SHA512", base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    )
    monkeypatch.setattr(browser, "DRIVER_SHA256", hashlib.sha256(wheel).hexdigest())
    return Registries(tarball, wheel)


def left_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != ".lock")


def test_the_build_is_unpacked_once_and_then_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = pin(monkeypatch)
    found = registry_build(tmp_path, reg.npm, reg.pip, registry="https://npm.example/")
    folder = build_dir(tmp_path)
    assert found == Browser(
        str(folder / "chromium"),
        str(folder / "chromedriver"),
        {"LD_LIBRARY_PATH": str(folder / "lib"), "FONTCONFIG_FILE": str(folder / "fonts.conf")},
    )
    assert reg.urls == ["https://npm.example/@sparticuz/chromium/-/chromium-153.0.0.tgz"]
    assert reg.requirements == ["chromedriver-py==153.0.8010.52"]
    assert (folder / "chromium").read_bytes() == CHROMIUM
    assert (folder / "chromedriver").read_bytes() == DRIVER
    assert os.access(folder / "chromium", os.X_OK) and os.access(folder / "chromedriver", os.X_OK)
    # the libraries flat in lib/ (LD_LIBRARY_PATH), the font under fonts/
    assert sorted(p.name for p in (folder / "lib").iterdir()) == ["libEGL.so", "libnss3.so"]
    assert (folder / "fonts" / "fonts" / "Open_Sans" / "OpenSans-Regular.ttf").exists()
    # the font configuration names the final folder, not the one it was unpacked in
    assert f"<dir>{folder / 'fonts'}</dir>" in (folder / "fonts.conf").read_text()
    assert left_in(tmp_path) == [folder.name]  # no download or half-unpacked folder kept

    again = registry_build(tmp_path, reg.npm, reg.pip)
    assert again == found
    assert len(reg.urls) == 1 and len(reg.requirements) == 1  # nothing fetched again


@pytest.mark.parametrize("tampered", ["tarball", "wheel"])
def test_a_download_that_is_not_the_pinned_one_is_refused_and_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tampered: str
) -> None:
    reg = pin(monkeypatch)
    setattr(reg, tampered, getattr(reg, tampered) + b"\0")
    with pytest.raises(DigestMismatch) as caught:
        registry_build(tmp_path, reg.npm, reg.pip)
    if tampered == "tarball":
        assert str(caught.value).startswith("@sparticuz/chromium 153.0.0: sha512 ")
        assert str(caught.value).endswith(f", expected {browser.CHROMIUM_SHA512}")
        assert reg.requirements == []  # refused before anything else was fetched
    else:
        assert str(caught.value).startswith("chromedriver-py 153.0.8010.52: sha256 ")
        assert str(caught.value).endswith(f", expected {browser.DRIVER_SHA256}")
    assert left_in(tmp_path) == []


@pytest.mark.parametrize(
    ("chromium_br", "message"),
    [
        (brotli.compress(CHROMIUM * 1000)[:-4], "truncated brotli stream"),
        (b"not brotli at all" * 4, "corrupt brotli stream: brotli: decoder failed"),
    ],
    ids=["truncated", "corrupt"],
)
def test_an_archive_that_does_not_unpack_is_refused_and_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chromium_br: bytes, message: str
) -> None:
    reg = pin(monkeypatch, npm_tarball(chromium_br))  # the pinned file itself is broken
    with pytest.raises(ValueError, match=f"^{message}$"):
        registry_build(tmp_path, reg.npm, reg.pip)
    assert left_in(tmp_path) == []


def _link_tar(name: str, target: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        t.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("libs_tar", "member"),
    [
        (_tar({"lib/../../escaped.so": b"x"}), "lib/../../escaped.so"),
        (_tar({"/etc/escaped.so": b"x"}), "/etc/escaped.so"),
        (_link_tar("lib/libnss3.so", "/etc/passwd"), "lib/libnss3.so"),
    ],
    ids=["dot-dot", "absolute", "symlink"],
)
def test_an_archive_member_that_is_not_a_plain_file_inside_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, libs_tar: bytes, member: str
) -> None:
    reg = pin(monkeypatch, npm_tarball(libs_tar=libs_tar))
    with pytest.raises(ValueError, match=f"^refused archive member {member!r}$"):
        registry_build(tmp_path / "cache", reg.npm, reg.pip)
    assert left_in(tmp_path / "cache") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing written outside


def test_workers_that_want_the_browser_at_once_fetch_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = pin(monkeypatch)
    both = threading.Barrier(2)
    got: list[Browser] = []

    def worker() -> None:
        both.wait()
        got.append(registry_build(tmp_path, reg.npm, reg.pip))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 2 and got[0] == got[1]
    assert len(reg.urls) == 1


@pytest.mark.parametrize(
    ("failure", "why"),
    [
        (OSError("network is unreachable"), "OSError: network is unreachable"),
        # not only network errors: an old venv without brotli, say
        (
            ModuleNotFoundError("No module named 'brotli'"),
            "ModuleNotFoundError: No module named 'brotli'",
        ),
    ],
    ids=["offline", "no brotli"],
)
def test_find_browser_says_why_when_nothing_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception, why: str
) -> None:
    def fetch(url: str, dest: Path) -> None:
        raise failure

    monkeypatch.setattr(browser, "_on_path", lambda: None)
    monkeypatch.setattr(browser, "registry_supported", lambda: None)
    monkeypatch.setattr(browser, "npm_fetch", fetch)
    monkeypatch.setattr(
        browser, "_selenium_manager", lambda: "Selenium Manager could not fetch Chrome for Testing"
    )
    assert browser.find_browser(tmp_path) == (
        "no Chromium and chromedriver on PATH (apt-get install chromium chromium-driver); "
        f"the registries' build could not be fetched: {why}; "
        "Selenium Manager could not fetch Chrome for Testing"
    )
    assert left_in(tmp_path) == []


def test_what_an_interrupted_fetch_or_another_version_left_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed fetch leaves its temporary folder; an older pin its build; a damaged build
    lacks its browser. The next fetch removes the first two and fetches the third again."""
    reg = pin(monkeypatch)
    (tmp_path / ".fetch-killed" / "build").mkdir(parents=True)
    (tmp_path / "chromium-152.0.0-driver-152.0.7999.1-layout-1" / "lib").mkdir(parents=True)
    damaged = build_dir(tmp_path)
    (damaged / "lib").mkdir(parents=True)
    (damaged / "chromedriver").write_bytes(b"left over")
    (tmp_path / "unrelated.txt").write_text("kept")
    found = registry_build(tmp_path, reg.npm, reg.pip)
    assert left_in(tmp_path) == [damaged.name, "unrelated.txt"]
    assert Path(found.binary).read_bytes() == CHROMIUM
    assert Path(found.driver).read_bytes() == DRIVER
    assert len(reg.urls) == 1


class _Truncating(http.server.BaseHTTPRequestHandler):
    """Promises 1,000 bytes and sends 10."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"0123456789")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def test_a_download_cut_short_is_reported_as_such(tmp_path: Path) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Truncating)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/chromium.tgz"
    try:
        with pytest.raises(OSError) as caught:
            browser.npm_fetch(url, tmp_path / "chromium.tgz")
    finally:
        thread.join(10)
        server.server_close()
    # not a digest mismatch, which would read as tampering
    assert str(caught.value) == f"{url}: the download stopped at 10 of 1000 bytes"


def test_a_build_whose_driver_does_not_start_here_is_no_browser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver that cannot load its libraries (as on a container without GLib) makes the
    browser tests skip with the loader's words, not fail in Selenium."""
    missing = (
        "chromedriver: error while loading shared libraries: libglib-2.0.so.0: cannot open "
        "shared object file: No such file or directory"
    )
    reg = pin(monkeypatch, wheel=driver_wheel(f"#!/bin/sh\necho '{missing}' >&2\nexit 127\n"))
    monkeypatch.setattr(browser, "_on_path", lambda: None)
    monkeypatch.setattr(browser, "registry_supported", lambda: None)
    monkeypatch.setattr(browser, "npm_fetch", reg.npm)
    monkeypatch.setattr(browser, "pip_fetch", reg.pip)
    monkeypatch.setattr(browser, "_selenium_manager", lambda: "no Selenium Manager")
    assert browser.find_browser(tmp_path) == (
        "no Chromium and chromedriver on PATH (apt-get install chromium chromium-driver); "
        f"chromedriver does not start here: {missing}; no Selenium Manager"
    )
    # the synthetic browser and driver of the other tests do start
    assert (
        browser.does_not_start(registry_build(tmp_path / "ok", *pin(monkeypatch).fetches)) is None
    )


@pytest.mark.timeout(900)  # the first run on a machine downloads about 120 MB
def test_the_pinned_build_renders_a_page(tmp_path: Path) -> None:
    """The real archives, from the real registries, into the user's cache (fetched once per
    machine): their digests still match, the browser starts through its driver and paints
    text in its own font. It runs where the browser tests need this build (no Chromium on
    PATH) or when FETCH_BROWSER=1 asks for it (CI, to keep the pins honest). Where the build
    does not start (no GLib, XCB or D-Bus on the machine) it skips as the browser tests do,
    unless FETCH_BROWSER=1 or REQUIRE_BROWSER=1 makes that a failure."""
    why_not = browser.registry_supported()
    if why_not is not None:
        pytest.skip(why_not)
    asked = os.environ.get("FETCH_BROWSER") == "1"
    if not asked and browser._on_path() is not None:
        pytest.skip(
            "Chromium is on PATH, so the browser tests use it; FETCH_BROWSER=1 checks "
            "the registries' build too"
        )
    required = asked or os.environ.get("REQUIRE_BROWSER") == "1"
    try:
        found = registry_build(browser.cache_root())
    except Exception as exc:  # no registry reachable, a download cut short
        if required:
            raise
        pytest.skip(f"the registries' build could not be fetched: {type(exc).__name__}: {exc}")
    # a machine without the GLib, XCB and D-Bus its driver needs: as the browser tests do
    why_not = browser.does_not_start(found)
    if why_not is not None:
        if required:
            pytest.fail(why_not)
        pytest.skip(why_not)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = found.binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    service = Service(executable_path=found.driver, env={**os.environ, **found.env})
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        driver.get("data:text/html,<h1 id=t style='color:rgb(1,2,3)'>Lead routed</h1>")
        h1 = driver.find_element("id", "t")
        assert h1.text == "Lead routed"
        assert h1.value_of_css_property("color") == "rgba(1, 2, 3, 1)"
        assert h1.size["width"] > 50  # glyphs were laid out: a font was found
        assert driver.get_screenshot_as_file(str(tmp_path / "page.png"))
        assert "HeadlessChrome/153." in driver.execute_script("return navigator.userAgent")
    finally:
        driver.quit()
