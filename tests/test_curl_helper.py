"""tests/helpers/curl.py: the curl the tutorial test uses on a machine without one. Real HTTP
to a real local server; the command lines are the tutorial's."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import curl


class _Echo(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "type": self.headers.get("Content-Type"),
                "body": self.rfile.read(length).decode(),
            }
        ).encode()
        self.send_response(404 if self.path == "/missing" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    script = curl.write_script(tmp_path / "bin")
    return subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=30)


def test_the_tutorials_command_lines_send_what_curl_sends(server: str, tmp_path: Path) -> None:
    body = '{"records": [{"object": "Lead"}]}'
    posted = run(
        tmp_path,
        "-s",
        "-X",
        "POST",
        f"{server}/_sandbox/seed",
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
    )
    assert (posted.returncode, json.loads(posted.stdout)) == (
        0,
        {"method": "POST", "path": "/_sandbox/seed", "type": "application/json", "body": body},
    )
    got = run(tmp_path, "-s", f"{server}/healthz")
    assert json.loads(got.stdout)["method"] == "GET" and not got.stdout.endswith("\n")
    missing = run(tmp_path, "-s", f"{server}/missing")  # curl prints an error status's body
    assert (missing.returncode, json.loads(missing.stdout)["path"]) == (0, "/missing")


def test_what_it_cannot_do_is_refused(tmp_path: Path) -> None:
    for argv, why in [
        (["-s", "--fail", "http://127.0.0.1:9/"], "not supported here: '--fail'"),
        (["-s", "-H"], "-H needs a value"),
        (["-s"], "no URL"),
    ]:
        got = run(tmp_path, *argv)
        assert (got.returncode, got.stdout) == (2, ""), argv
        assert got.stderr == f"curl (tests/helpers/curl.py): {why}\n"
    assert run(tmp_path, "-s", "http://127.0.0.1:9/").returncode == 7  # nothing listens


def test_it_is_installed_only_where_curl_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert curl.install_if_missing(tmp_path / "bin")
    assert (tmp_path / "bin" / "curl").stat().st_mode & 0o111
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert not curl.install_if_missing(tmp_path / "other")
