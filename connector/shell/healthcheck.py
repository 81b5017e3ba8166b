"""A container's health probe: ``python -m connector.shell.healthcheck`` exits 0 when the
admin listener of this container answers ``GET /healthz`` with 200, else 1 with one line why.

It calls ``127.0.0.1:$CONNECTOR_ADMIN_PORT`` (default 9100) with ``$CONNECTOR_ADMIN_TOKEN`` as
the bearer token when one is set, so the probe works whether or not the admin port is
published. Standard library only: it starts in a fraction of the CLI's time.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping


def probe_request(env: Mapping[str, str]) -> urllib.request.Request:
    """The request the probe sends."""
    port = env.get("CONNECTOR_ADMIN_PORT", "").strip() or "9100"
    token = env.get("CONNECTOR_ADMIN_TOKEN", "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers=headers)


def main(env: Mapping[str, str] | None = None, timeout: float = 2.0) -> int:
    request = probe_request(os.environ if env is None else env)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"healthcheck: {request.full_url}: {type(exc).__name__}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"healthcheck: {request.full_url} answered {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
