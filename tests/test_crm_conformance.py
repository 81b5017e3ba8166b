"""Every adapter, same cases: the two real adapters against the in-process sandboxes with the
real client libraries, and the in-memory CRM in both dialects.

The cases are about meaning (what write_owners returns or raises, what reads return), so the
in-memory twin must pass them too: the dispatcher's tests rely on it behaving like the real
adapters. Only what exists on a wire stays with the real adapters: dropped connections and
timeouts (`wire` fixture) and the quota headers that usage() reports.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crm_adapters.base import (
    CrmAdapter,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
)
from crm_adapters.batching import plan_batches
from crm_adapters.memory import MemoryCrm
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox
from testbed.waiting import between_stamps, wait_until
from tests.helpers.crm_harness import Harness, hs_sandbox, sf_sandbox

__all__ = ["hs_sandbox", "sf_sandbox"]

REAL = ["salesforce", "hubspot"]
ALL = [*REAL, "memory-salesforce", "memory-hubspot"]


def _harness(request: pytest.FixtureRequest, backend: str) -> Iterator[Harness]:
    if backend.startswith("memory-"):
        kind = backend.removeprefix("memory-")
        harness = Harness(kind, MemoryCrm(kind))
    else:
        sb: SalesforceSandbox | HubSpotSandbox = request.getfixturevalue(
            "sf_sandbox" if backend == "salesforce" else "hs_sandbox"
        )
        harness = Harness(backend, sb)
    harness.new_parent()
    yield harness
    harness.clear_faults()


@pytest.fixture(params=ALL)
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from _harness(request, request.param)


@pytest.fixture(params=REAL)
def wire(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The real adapters only, for cases about the transport."""
    yield from _harness(request, request.param)


def test_adapter_satisfies_protocol(h: Harness) -> None:
    a = h.adapter()
    assert isinstance(a, CrmAdapter)
    assert a.kind == h.kind
    assert a.max_batch == (200 if h.kind == "salesforce" else 100)


def test_write_owners_then_read_back(h: Harness) -> None:
    old, new = h.owner(), h.owner()
    ids = [h.record(old) for _ in range(5)]
    writes = [OwnerWrite(f"k{i}", rid, new, h.parent) for i, rid in enumerate(ids)]
    out = h.adapter().write_owners(writes)
    assert [o.key for o in out] == [w.key for w in writes]
    assert all(o.ok and o.error is None for o in out)
    assert all(h.owner_of(rid) == new for rid in ids)


def test_empty_batch_and_oversized_batch(h: Harness) -> None:
    a = h.adapter()
    assert a.write_owners([]) == []
    too_many = [OwnerWrite(str(i), h.missing_id(), "x", None) for i in range(a.max_batch + 1)]
    with pytest.raises(ValueError):
        a.write_owners(too_many)


def test_partial_failures_are_outcomes_in_order(h: Harness) -> None:
    good, inactive = h.owner(), h.owner(active=False)
    r_ok1, r_bad_owner, r_deleted, r_poison, r_ok2 = (h.record() for _ in range(5))
    h.delete(r_deleted)
    h.poison([r_poison])
    writes = [
        OwnerWrite("a", r_ok1, good, h.parent),
        OwnerWrite("b", r_bad_owner, inactive, h.parent),
        OwnerWrite("c", r_deleted, good, h.parent),
        OwnerWrite("d", r_poison, good, h.parent),
        OwnerWrite("e", h.missing_id(), good, h.parent),
        OwnerWrite("f", r_ok2, good, h.parent),
    ]
    out = h.adapter().write_owners(writes)
    assert [o.key for o in out] == list("abcdef")
    assert [o.ok for o in out] == [True, False, False, False, False, True]
    for o in out[1:5]:
        assert isinstance(o.error, PermanentError), o
    assert h.owner_of(r_ok1) == good and h.owner_of(r_ok2) == good
    assert h.owner_of(r_bad_owner) is None


def test_unknown_owner_is_permanent(h: Harness) -> None:
    rid = h.record()
    bogus = "005SB9999999999AAA" if h.kind == "salesforce" else "424242"
    (out,) = h.adapter().write_owners([OwnerWrite("k", rid, bogus, h.parent)])
    assert not out.ok and isinstance(out.error, PermanentError)


def test_5xx_raises_retryable(h: Harness) -> None:
    a = h.adapter()
    rid, owner = h.record(), h.owner()
    a.check_owners([owner])  # warm up (token fetch) so the fault hits the write
    h.inject_5xx(1, 503)
    with pytest.raises(RetryableError) as ei:
        a.write_owners([OwnerWrite("k", rid, owner, h.parent)])
    assert not isinstance(ei.value, RateLimitedError)
    assert a.write_owners([OwnerWrite("k", rid, owner, h.parent)])[0].ok


def test_rate_limit_raises_rate_limited(h: Harness) -> None:
    a = h.adapter()
    rid, owner = h.record(), h.owner()
    a.check_owners([owner])
    h.inject_429()
    with pytest.raises(RateLimitedError) as ei:
        a.write_owners([OwnerWrite("k", rid, owner, h.parent)])
    assert ei.value.retry_after is not None and ei.value.retry_after > 0
    assert ei.value.scope == ("org" if h.kind == "salesforce" else "request")


def test_dropped_connection_and_timeout_are_retryable(wire: Harness) -> None:
    assert isinstance(wire.sandbox, SalesforceSandbox | HubSpotSandbox)
    a = wire.adapter(timeout=0.3)
    rid, owner = wire.record(), wire.owner()
    a.check_owners([owner])
    wire.sandbox.drop_connections(1)
    with pytest.raises(RetryableError) as ei:
        a.write_owners([OwnerWrite("k", rid, owner, wire.parent)])
    assert ei.value.code == "connection"
    wire.sandbox.set_latency(0.6)
    with pytest.raises(RetryableError) as ei:
        a.write_owners([OwnerWrite("k", rid, owner, wire.parent)])
    assert ei.value.code in ("timeout", "connection")
    wire.sandbox.set_latency(0)
    # The sandbox still applies the write the client gave up on, 0.6 s after it arrived: wait
    # for it, so that its late stamp cannot fall into the next test's time window.
    wait_until(lambda: wire.owner_of(rid) == owner, 10, "the timed-out write to land")


def test_changed_since_pages_ascending(h: Harness) -> None:
    owner = h.owner()
    since = between_stamps()  # after whatever the harness stamped, before every new record
    ids = [h.record(owner) for _ in range(450)]
    pages = list(h.adapter().changed_since(since, page_size=200))
    assert len(pages) >= 3
    got = [r for p in pages for r in p]
    assert [r.crm_id for r in got] == ids
    stamps = [r.modified_at for r in got]
    assert stamps == sorted(stamps) and stamps[0] >= since
    assert all(r.fields[h.owner_field] == owner for r in got)


def test_changed_since_until_bound(h: Harness) -> None:
    owner = h.owner()
    since = between_stamps()  # stamps have ms resolution: these fall strictly between them
    first = [h.record(owner) for _ in range(3)]
    until = between_stamps()
    h.record(owner)
    got = [r.crm_id for p in h.adapter().changed_since(since, until) for r in p]
    assert got == first


def test_fetch_records(h: Harness) -> None:
    owner = h.owner()
    ids = [h.record(owner) for _ in range(3)]
    deleted = h.record(owner)
    h.delete(deleted)
    recs = h.adapter().fetch_records([ids[2], h.missing_id(), deleted, ids[0]], [])
    assert [r.crm_id for r in recs] == [ids[2], ids[0]]
    assert all(r.fields[h.owner_field] == owner for r in recs)


def test_check_owners(h: Harness) -> None:
    active, inactive = h.owner(), h.owner(active=False)
    missing = "005SB9999999999AAA" if h.kind == "salesforce" else "31337"
    res = h.adapter().check_owners([active, inactive, missing])
    assert res[active] is None
    assert res[inactive] in ("inactive", "archived")
    assert res[missing] == "not found"


def test_usage_reports_quota(h: Harness) -> None:
    a = h.adapter()
    a.check_owners([h.owner()])
    u = a.usage()
    assert u["kind"] == h.kind
    if h.in_memory:
        assert isinstance(u["requests"], int) and u["requests"] >= 1  # no quota to report
    elif h.kind == "salesforce":
        assert isinstance(u["api_usage"], dict) and u["api_usage"]["total"] > 0
    else:
        assert u["rate_limit_headers"]


def test_plan_batches_feed_write_owners(h: Harness) -> None:
    a = h.adapter()
    owner = h.owner()
    writes = []
    for p in range(3):
        parent = h.new_parent() or f"p{p}"
        writes += [OwnerWrite(f"{p}-{i}", h.record(), owner, parent) for i in range(40)]
    batches = plan_batches(writes, a.max_batch)
    outcomes = [o for b in batches for o in a.write_owners(b)]
    assert all(o.ok for o in outcomes) and len(outcomes) == 120
