"""Lead-to-account matching: domain normalisation and the match decision (pure, no I/O).

A lead belongs to an Account (Salesforce) or Company (HubSpot) when its parent field names
one (a Contact's ``AccountId``), or when a domain taken from one of its match fields (email,
website) equals a domain of the account. Domains compare as *registrable domains*: the host
lower-cased, IDNA-encoded (punycode), without scheme, userinfo, port, path, trailing dot or
subdomains, reduced with the public suffix list bundled in the ``publicsuffixlist`` wheel
(never fetched at run time). So ``https://WWW.Example.co.uk/path``, ``mail.example.co.uk`` and
``user@sub.example.co.uk`` are all ``example.co.uk``. Free-mail domains (``freemail.txt``
beside this module) never match, and neither do IP addresses or bare public suffixes.

The decision for one lead, in order:

1. The parent account, when the lead names one that the mirror knows.
2. Otherwise the match fields in their configured order: the first field whose domain belongs
   to at least one account decides.
3. The accounts found must agree on one owner; accounts that share a domain with *different*
   owners are ``ambiguous`` and the lead falls back to the rule's team rotation (the connector
   does not guess between two owners). Among agreeing accounts, the most recently modified
   one (then the lowest id) is the one recorded.
4. The owner must be an active member of one of the org's teams; else ``owner_inactive``
   or ``owner_not_a_rep``, and the lead falls back.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any, Literal

from publicsuffixlist import PublicSuffixList

__all__ = [
    "AccountDecision",
    "AccountRow",
    "Rep",
    "decide",
    "is_free_mail",
    "lead_domains",
    "registrable_domain",
]

MAX_INPUT = 2048
_LABEL_OK = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")

Result = Literal[
    "matched", "no_account", "ambiguous", "no_owner", "owner_inactive", "owner_not_a_rep"
]
By = Literal["parent", "domain"]


@cache
def _psl() -> PublicSuffixList:
    """The bundled Public Suffix List (ICANN and private sections), parsed once."""
    return PublicSuffixList()


@cache
def _free_mail() -> tuple[frozenset[str], frozenset[str]]:
    """(exact registrable domains, first labels valid under any suffix: ``yahoo.*``)."""
    text = resources.files("connector.routing").joinpath("freemail.txt").read_text("utf-8")
    exact: set[str] = set()
    any_suffix: set[str] = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip().lower()
        if not line:
            continue
        if line.endswith(".*"):
            any_suffix.add(line[:-2])
        else:
            exact.add(line)
    return frozenset(exact), frozenset(any_suffix)


def _host_of(value: str) -> str:
    """The host part of an email address, URL or bare host name (not yet validated)."""
    s = value.strip()
    if "@" in s and "://" not in s:  # an email address: the domain after the last @
        s = s.rsplit("@", 1)[1]
    elif "://" in s:
        s = s.split("://", 1)[1]
    elif s.startswith("//"):
        s = s[2:]
    for sep in "/?#":  # path, query, fragment
        s = s.split(sep, 1)[0]
    s = s.rsplit("@", 1)[-1]  # userinfo in a URL
    if s.startswith("["):  # [IPv6]:port
        return s.split("]", 1)[0] + "]"
    if s.count(":") == 1:  # host:port
        s = s.split(":", 1)[0]
    return s


def _is_ip(host: str) -> bool:
    candidate = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return candidate.count(":") > 1  # an IPv6 literal that the stdlib refused
    return True


def _to_ascii(host: str) -> str | None:
    """IDNA A-labels (punycode) for a host written in Unicode; None if it cannot be one."""
    labels = host.split(".")
    out: list[str] = []
    for label in labels:
        if not label:
            return None
        if label.isascii():
            out.append(label)
            continue
        try:
            out.append(label.encode("idna").decode("ascii"))
        except UnicodeError:
            return None
    return ".".join(out)


def registrable_domain(value: object) -> str | None:
    """The registrable domain of an email address, URL or host name, or None.

    None for anything that cannot identify one organisation: empty or garbage text, an IP
    address, a bare public suffix (``co.uk``), a single label (``localhost``).
    """
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_INPUT:
        return None
    host = _host_of(value).strip().lower().rstrip(".").lstrip(".")
    if not host or _is_ip(host):
        return None
    ascii_host = _to_ascii(host)
    if ascii_host is None:
        return None
    ascii_host = ascii_host.lower()
    if len(ascii_host) > 253:
        return None
    for label in ascii_host.split("."):
        if not 1 <= len(label) <= 63 or not set(label) <= _LABEL_OK:
            return None
        if label.startswith("-") or label.endswith("-"):
            return None
    if "." not in ascii_host:
        return None
    if ascii_host.rsplit(".", 1)[1].isdigit():  # 10.1.2, 1.2.3.4.5: not a name
        return None
    domain = _psl().privatesuffix(ascii_host)
    return str(domain) if domain else None


def is_free_mail(domain: str) -> bool:
    """Whether a registrable domain is a free-mail or consumer provider's."""
    exact, any_suffix = _free_mail()
    if domain in exact:
        return True
    first = domain.split(".", 1)[0]
    return first in any_suffix


def matchable_domain(value: object) -> str | None:
    """``registrable_domain`` unless it is a free-mail domain (which never matches)."""
    domain = registrable_domain(value)
    return None if domain is None or is_free_mail(domain) else domain


def account_domains(values: Iterable[object]) -> list[str]:
    """The matchable domains of an account's website and domain fields, unique, in order."""
    out: dict[str, None] = {}
    for v in values:
        if isinstance(v, str):
            # HubSpot and custom fields may hold several domains separated by ; or ,
            for part in v.replace(",", ";").split(";"):
                d = matchable_domain(part)
                if d:
                    out.setdefault(d, None)
    return list(out)


def lead_domains(fields: Mapping[str, Any], match_fields: Sequence[str]) -> list[tuple[str, str]]:
    """(field, domain) for each match field that yields a matchable domain, in field order;
    a domain already found by an earlier field is not repeated."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name in match_fields:
        d = matchable_domain(fields.get(name))
        if d and d not in seen:
            seen.add(d)
            out.append((name, d))
    return out


@dataclass(frozen=True)
class AccountRow:
    """One account of the mirror (ids and owner in their stored, comparable form)."""

    crm_id: str
    owner_id: str | None
    modified_at: datetime


@dataclass(frozen=True)
class Rep:
    """An owner key's standing in the org's config: active in at least one team or not."""

    active: bool


@dataclass(frozen=True)
class AccountDecision:
    """Why a lead under an ``account_owner`` rule went where it went."""

    result: Result
    by: By | None = None
    account_id: str | None = None
    owner_id: str | None = None
    field: str | None = None
    domain: str | None = None
    candidates: tuple[str, ...] = ()

    @property
    def matched(self) -> bool:
        return self.result == "matched"

    def as_json(self) -> dict[str, Any]:
        """The decision as stored with the assignment (``assignments.account_match``)."""
        out: dict[str, Any] = {"result": self.result}
        for key in ("by", "account_id", "owner_id", "field", "domain"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.candidates:
            out["candidates"] = list(self.candidates)
        return out


def _recency(a: AccountRow) -> tuple[float, str]:
    return (-a.modified_at.timestamp(), a.crm_id)


def _judge_owner(
    accounts: Sequence[AccountRow],
    by: By,
    reps: Mapping[str, Rep],
    field_name: str | None = None,
    domain: str | None = None,
) -> AccountDecision:
    ordered = sorted(accounts, key=_recency)
    owners = {a.owner_id for a in ordered}
    ids = tuple(a.crm_id for a in ordered)
    if len(owners) > 1:
        return AccountDecision("ambiguous", by, None, None, field_name, domain, ids)
    chosen = ordered[0]
    owner = chosen.owner_id
    base = (by, chosen.crm_id, owner, field_name, domain)
    if not owner:
        return AccountDecision("no_owner", *base)
    rep = reps.get(owner)
    if rep is None:
        return AccountDecision("owner_not_a_rep", *base)
    if not rep.active:
        return AccountDecision("owner_inactive", *base)
    return AccountDecision("matched", *base)


def decide(
    parent_id: str | None,
    domains: Sequence[tuple[str, str]],
    by_id: Mapping[str, AccountRow],
    by_domain: Mapping[str, Sequence[AccountRow]],
    reps: Mapping[str, Rep],
) -> AccountDecision:
    """One lead's decision. ``parent_id`` and the accounts' ids and owners must be in the
    same comparable form as the keys of ``by_id`` and ``reps``; ``domains`` comes from
    ``lead_domains``; ``by_domain`` lists every mirrored account of each domain."""
    if parent_id and parent_id in by_id:
        return _judge_owner([by_id[parent_id]], "parent", reps)
    for field_name, domain in domains:
        found = by_domain.get(domain)
        if found:
            return _judge_owner(found, "domain", reps, field_name, domain)
    return AccountDecision("no_account")
