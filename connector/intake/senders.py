"""Who sent this request? Pure checks for the senders the receivers accept.

Salesforce Outbound Messages are not signed, and the OrganizationId they carry is no secret
(every Web-to-Lead form shows it). So a Salesforce endpoint URL ends with a per-org secret
(``/webhooks/salesforce/{org}/{secret}``) that only Salesforce's configuration holds, compared
in constant time, and optionally the sender's address must be in an allowlist (Salesforce's
published ranges). The address is the TCP peer, or, only when the peer is a configured
trusted proxy, the last address in X-Forwarded-For that is not itself a trusted proxy.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Sequence

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def secret_matches(given: str, secrets: Sequence[str]) -> bool:
    """Constant-time check of ``given`` against every configured secret (no early exit, so
    the time taken does not tell which one, or how much of it, matched)."""
    given_b = given.encode()
    ok = False
    for s in secrets:
        ok |= hmac.compare_digest(given_b, s.encode())
    return ok and bool(secrets)


def parse_networks(cidrs: Iterable[str]) -> list[IPNetwork]:
    return [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip()]


def _address(value: str) -> IPAddress | None:
    v = value.strip()
    if v.startswith("[") and "]" in v:  # [v6]:port
        v = v[1 : v.index("]")]
    elif v.count(":") == 1:  # v4:port
        v = v.split(":", 1)[0]
    try:
        return ipaddress.ip_address(v)
    except ValueError:
        return None


def in_networks(address: IPAddress | None, networks: Sequence[IPNetwork]) -> bool:
    if address is None:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address.version == n.version and address in n for n in networks)


def client_address(
    peer: str | None, forwarded_for: str | None, trusted_proxies: Sequence[IPNetwork]
) -> IPAddress | None:
    """The sender's address: the peer, unless the peer is a trusted proxy; then the right-most
    X-Forwarded-For entry that is not a trusted proxy (entries to its left are the client's
    own claims and are never believed). None when it cannot be told."""
    addr = _address(peer) if peer else None
    if addr is None or not in_networks(addr, trusted_proxies):
        return addr
    hops = [h for h in (forwarded_for or "").split(",") if h.strip()]
    for hop in reversed(hops):
        hop_addr = _address(hop)
        if hop_addr is None:
            return None
        if not in_networks(hop_addr, trusted_proxies):
            return hop_addr
    return addr


def printable_id(value: str, limit: int = 24) -> str:
    """A received id made safe to log: printable characters only, at most ``limit`` long."""
    clean = "".join(c if c.isprintable() and not c.isspace() else "?" for c in value[:limit])
    return clean + ("…" if len(value) > limit else "")
