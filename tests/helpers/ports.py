"""TCP ports for servers the tests start as subprocesses (which must be told a port).

Asking the kernel for an ephemeral port and closing it leaves a window in which any outgoing
connection on the machine (there are thousands during the fault suite) may take that port.
Ports here come from below the ephemeral range, which the kernel never hands out by itself,
from a band of their own for each pytest-xdist worker, and are never handed out twice by one
process, so parallel workers cannot collide; a port some other program holds is skipped.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

_LOW, _HIGH = 20_000, 32_000  # below Linux's default ephemeral range (32768-60999)
_BAND = 750  # ports per xdist worker: 16 workers fit
_lock = threading.Lock()
_given: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = name.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    """A port on 127.0.0.1 that is free now and that no other test worker will hand out."""
    high = min(_HIGH, _ephemeral_floor())
    bands = max(1, (high - _LOW) // _BAND)
    first = _LOW + (_worker_index() % bands) * _BAND
    if first + _BAND > high:  # an unusual ip_local_port_range: fall back to the kernel
        return _kernel_port()
    with _lock:
        offset = random.randrange(_BAND)  # two test runs at once start at different ports
        for i in range(_BAND):
            port = first + (offset + i) % _BAND
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    raise RuntimeError(f"no free port left in {first}-{first + _BAND - 1}")
