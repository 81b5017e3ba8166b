"""Connection admission, the file-limit budget and throttled logs: pure parts, no sockets
(the socket tests are in tests/test_http_server.py and tests/test_admin_listener.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from connector.core.config import ConfigError
from connector.core.throttled_log import ThrottledLog
from connector.intake.admission import Admission, ForwardedPeerLimit, peer_key
from connector.intake.http_server import ByteBudget
from connector.intake.senders import parse_networks
from connector.shell.fd_limits import (
    BASE_DESCRIPTORS,
    MIN_CONNECTIONS,
    connection_cap,
    count_from_env,
    reserved_descriptors,
)


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
        (None, None),
        ("", None),
        ("not-an-address", None),
    ],
)
def test_peer_key(host: str | None, key: str | None) -> None:
    assert peer_key(host) == key


def test_admission_caps_each_peer_and_the_total() -> None:
    adm = Admission(max_connections=5, per_peer=2)
    assert adm.admit("10.0.0.1") == (True, "10.0.0.1")
    assert adm.admit("10.0.0.1") == (True, "10.0.0.1")
    assert adm.admit("10.0.0.1") == (False, None)  # its third
    assert adm.admit("10.0.0.2")[0]
    assert adm.admit("2001:db8::1")[0]
    assert adm.admit("2001:db8::2")[0] is True
    assert adm.admit("2001:db8::3") == (False, None)  # the same /64 holds 2
    assert adm.total == 5
    assert adm.admit("10.0.0.9") == (False, None)  # the total
    adm.release("10.0.0.1")
    assert adm.by_peer["10.0.0.1"] == 1
    assert adm.admit("10.0.0.1")[0]
    for key in ("10.0.0.1", "10.0.0.1", "10.0.0.2", "2001:db8::/64", "2001:db8::/64"):
        adm.release(key)
    assert (adm.total, adm.by_peer) == (0, {})


def test_admission_without_per_peer_cap_and_behind_a_proxy() -> None:
    open_ = Admission(max_connections=3, per_peer=None)
    assert [open_.admit("10.0.0.1")[0] for _ in range(4)] == [True, True, True, False]
    proxied = Admission(
        max_connections=10, per_peer=1, trusted_proxies=parse_networks(["10.9.0.0/16"])
    )
    # a trusted proxy's connections count only toward the total
    assert [proxied.admit("10.9.1.1") for _ in range(3)] == [(True, None)] * 3
    assert proxied.admit("10.0.0.1") == (True, "10.0.0.1")
    assert proxied.admit("10.0.0.1") == (False, None)
    with pytest.raises(ValueError):
        Admission(0)
    with pytest.raises(ValueError):
        Admission(5, per_peer=0)


def test_forwarded_peer_limit_counts_requests_in_flight_per_forwarded_client() -> None:
    release = asyncio.Event()
    served: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        served.append(scope["client"][0])
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limit = ForwardedPeerLimit(app, 1, parse_networks(["10.9.0.0/16"]))

    async def call(peer: str, forwarded: str) -> int:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "client": (peer, 1234),
            "headers": [(b"x-forwarded-for", forwarded.encode())],
        }
        await limit(scope, None, send)
        return int(sent[0]["status"])

    async def scenario() -> list[int]:
        first = asyncio.create_task(call("10.9.1.1", "198.51.100.1"))
        await asyncio.sleep(0)  # the first is in flight
        # the same client again, through the proxy: refused; another client: served;
        # a spoofed header from an untrusted peer: not believed, served
        second = asyncio.create_task(call("10.9.1.1", "198.51.100.1"))
        third = asyncio.create_task(call("10.9.1.1", "198.51.100.2"))
        fourth = asyncio.create_task(call("203.0.113.5", "198.51.100.1"))
        await asyncio.sleep(0)
        release.set()
        return list(await asyncio.gather(first, second, third, fourth))

    assert asyncio.run(scenario()) == [200, 503, 200, 200]
    assert limit.in_flight == {}


def test_byte_budget_is_given_back() -> None:
    budget = ByteBudget(100)
    with budget.hold() as a, budget.hold() as b:
        assert a.take(60)
        assert not b.take(41)  # over: nothing taken
        assert b.take(40)
        assert budget.held == 100
    assert budget.held == 0


def test_connection_cap_leaves_room_for_the_pools() -> None:
    reserved = reserved_descriptors(database_connections=29, orgs=2, admin_connections=64)
    assert reserved == BASE_DESCRIPTORS + 29 + 2 * 16 + 64
    assert connection_cap(1_048_576, reserved, 1000) == 1000
    # the common soft limit: the cap shrinks so the pools and the admin listener still fit
    assert connection_cap(1024, reserved, 1000) == 1024 - reserved
    with pytest.raises(ConfigError) as refused:
        connection_cap(256, reserved, 1000)
    message = str(refused.value)
    assert "\n" not in message
    assert message == (
        f"the open-file limit (256) leaves 3 connections after the {reserved} files the "
        "database pools, CRM clients and admin listener need; raise it (ulimit -n, the hard "
        f"limit) to at least {reserved + MIN_CONNECTIONS}"
    )


@pytest.mark.parametrize("raw", ["-1", "1e3", "ten", "1" * 10, "１２"])
def test_count_from_env_refuses_what_is_not_a_count(raw: str) -> None:
    with pytest.raises(ConfigError, match="CONNECTOR_X must be a whole number"):
        count_from_env("CONNECTOR_X", 5, {"CONNECTOR_X": raw})
    assert count_from_env("CONNECTOR_X", 5, {}) == 5
    assert count_from_env("CONNECTOR_X", 5, {"CONNECTOR_X": " 0 "}) == 0


def test_throttled_log_writes_one_line_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    throttled = ThrottledLog(
        logging.getLogger("test.throttle"), interval=10.0, clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, "test.throttle"):
        written = [throttled("bad", "refused %s", i) for i in range(50)]
        assert throttled("other", "other kind")
        now[0] = 10.0
        assert throttled("bad", "refused %s", "late")
    assert written == [True] + [False] * 49
    assert [r.getMessage() for r in caplog.records] == [
        "refused 0",
        "other kind",
        "refused late (and 49 more since the previous line)",
    ]
