"""The part of curl that docs/tutorial.md uses, for a machine that has no curl.

`python3 dev.py test` needs only Python, and the tutorial test runs the tutorial's commands as
written; some are `curl -s [-X METHOD] [-H 'Name: value']... [-d BODY] URL` calls to the CRM
simulators and the admin listener. Where `curl` is on PATH the test uses it; where it is not,
``install_if_missing`` puts this script on the session's PATH under that name. It sends the
same real HTTP request with the standard library and prints the body as curl does (no newline
added, the body of an error status too, exit 7 when it cannot connect). Any other option is
refused (exit 2), so a tutorial line using more of curl fails here instead of passing
unchecked.
"""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path


def request_of(argv: list[str]) -> urllib.request.Request:
    """The request a curl command line asks for (ValueError for anything else)."""
    method: str | None = None
    headers: dict[str, str] = {}
    data: bytes | None = None
    url: str | None = None
    args = iter(argv)
    for arg in args:
        if arg == "-s":
            continue
        if arg in ("-X", "-H", "-d"):
            value = next(args, None)
            if value is None:
                raise ValueError(f"{arg} needs a value")
            if arg == "-X":
                method = value
            elif arg == "-H":
                name, sep, text = value.partition(":")
                if not sep:
                    raise ValueError(f"not a header: {value!r}")
                headers[name.strip()] = text.strip()
            else:
                data = value.encode()
                headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        elif arg.startswith("-") or url is not None:
            raise ValueError(f"not supported here: {arg!r}")
        else:
            url = arg
    if url is None:
        raise ValueError("no URL")
    return urllib.request.Request(
        url, data=data, headers=headers, method=method or ("POST" if data else "GET")
    )


def main(argv: list[str]) -> int:
    try:
        request = request_of(argv)
    except ValueError as exc:
        print(f"curl (tests/helpers/curl.py): {exc}", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            body = reply.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except OSError:
        return 7  # curl's "failed to connect"
    sys.stdout.buffer.write(body)
    return 0


def write_script(bin_dir: Path) -> Path:
    """An executable ``bin_dir/curl`` that runs this module."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "curl"
    here = str(Path(__file__))
    script.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({here!r}, run_name='__main__')\n"
    )
    script.chmod(0o755)
    return script


def install_if_missing(bin_dir: Path) -> bool:
    """Put a `curl` running this module into ``bin_dir`` (for the front of PATH) when the
    machine has no curl; whether it did."""
    if shutil.which("curl"):
        return False
    write_script(bin_dir)
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
