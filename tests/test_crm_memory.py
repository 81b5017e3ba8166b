"""The in-memory CRM's own knobs: scripted failures, the request log, overlap detection.

What it shares with the real adapters is in test_crm_conformance.py."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from crm_adapters.base import (
    AuthError,
    CrmAdapter,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
)
from crm_adapters.memory import MemoryCrm, Overlap, ServedRequest, dialect_for
from crm_adapters.salesforce_ids import canonical_15, to_18


def _crm(kind: str = "salesforce") -> tuple[MemoryCrm, str, str]:
    crm = MemoryCrm(kind)
    return crm, crm.add_user(), crm.add_parent()


def test_dialects() -> None:
    sf, hs = MemoryCrm("salesforce"), MemoryCrm("hubspot")
    assert isinstance(sf, CrmAdapter) and isinstance(hs, CrmAdapter)
    assert (sf.max_batch, sf.owner_field) == (200, "OwnerId")
    assert (hs.max_batch, hs.owner_field) == (100, "hubspot_owner_id")
    assert MemoryCrm("hubspot", max_batch=7).max_batch == 7
    with pytest.raises(ValueError, match="unknown CRM kind"):
        dialect_for("pipedrive")


def test_salesforce_ids_answer_in_either_form_and_hubspot_ids_exactly() -> None:
    crm, owner, parent = _crm()
    rid = crm.add_record(None, parent)
    short = canonical_15(rid)
    assert short is not None and len(rid) == 18
    (out,) = crm.write_owners([OwnerWrite("k", short, canonical_15(owner) or "", parent)])
    assert out.ok and crm.owner_of(rid) == owner
    assert [r.crm_id for r in crm.fetch_records([short, rid.lower()], [])] == [rid, rid]
    (bad,) = crm.write_owners([OwnerWrite("k", "not-an-id", owner)])
    assert isinstance(bad.error, PermanentError) and bad.error.code == "MALFORMED_ID"

    hs = MemoryCrm("hubspot")
    hid = hs.add_record()
    assert hs.fetch_records([hid, f" {hid}x"], []) == hs.fetch_records([hid], [])


def test_fetch_records_returns_owner_parent_and_requested_fields() -> None:
    crm, owner, parent = _crm()
    rid = crm.add_record(owner, parent, {"Country": "US"})
    (rec,) = crm.fetch_records([rid], ["Country", "Missing"])
    assert rec.fields == {"OwnerId": owner, "AccountId": parent, "Country": "US", "Missing": None}
    hs, hs_owner, _ = _crm("hubspot")
    (hrec,) = hs.fetch_records([hs.add_record(hs_owner)], [])
    assert hrec.fields == {"hubspot_owner_id": hs_owner}


def test_person_edit_and_inspection() -> None:
    crm, owner, parent = _crm()
    rid = crm.add_record(None, parent)
    before = crm.record(rid)
    crm.person_edit(rid, owner)
    after = crm.record(rid)
    assert before is not None and after is not None
    assert after.owner_id == owner and after.modified_at >= before.modified_at
    assert crm.record("003MC9999999999AAA") is None and crm.owner_of("nope") is None
    crm.delete(rid)
    assert crm.fetch_records([rid], []) == [] and crm.record(rid).deleted  # type: ignore[union-attr]


def test_an_injected_clock_makes_changed_since_deterministic() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ticks = iter(t0 + timedelta(seconds=i) for i in range(100))
    crm = MemoryCrm("hubspot", clock=lambda: next(ticks))
    ids = [crm.add_record() for _ in range(5)]  # stamped t0 .. t0+4s
    pages = list(crm.changed_since(t0 + timedelta(seconds=1), t0 + timedelta(seconds=4), 2))
    assert [[r.crm_id for r in p] for p in pages] == [ids[1:3], ids[3:4]]
    assert [r.op for r in crm.requests] == ["changed_since", "changed_since"]
    with pytest.raises(ValueError):
        list(crm.changed_since(t0, page_size=0))


# -- the request log --------------------------------------------------------------------------


def test_every_request_is_logged_in_order_but_empty_and_oversized_writes_are_not() -> None:
    crm, owner, parent = _crm()
    ids = [crm.add_record(None, parent) for _ in range(3)]
    crm.fetch_records(ids, [])
    crm.write_owners([OwnerWrite(str(i), r, owner, parent) for i, r in enumerate(ids)])
    crm.check_owners([owner])
    assert crm.write_owners([]) == []
    with pytest.raises(ValueError):
        crm.write_owners([OwnerWrite("k", ids[0], owner)] * 201)
    assert [(r.seq, r.op) for r in crm.requests] == [
        (1, "fetch_records"),
        (2, "write_owners"),
        (3, "check_owners"),
    ]
    (w,) = crm.write_requests()
    assert w.record_ids == tuple(ids) and w.parents == (parent,) and w.error is None
    assert crm.written_ids() == ids
    assert crm.usage() == {
        "kind": "salesforce",
        "requests": 3,
        "by_op": {"write_owners": 1, "fetch_records": 1, "changed_since": 0, "check_owners": 1},
    }


# -- scripted failures ------------------------------------------------------------------------


def test_request_failures_fire_in_order_after_and_times_and_change_nothing() -> None:
    crm, owner, parent = _crm()
    rid = crm.add_record(None, parent)
    write = [OwnerWrite("k", rid, owner, parent)]
    crm.fail_transient(times=2, after=1, retry_after=5.0)
    crm.fail_auth()
    assert crm.write_owners(write)[0].ok  # `after` lets the first through
    crm.person_edit(rid, None)
    for _ in range(2):
        with pytest.raises(RetryableError) as ei:
            crm.write_owners(write)
        assert (ei.value.code, ei.value.retry_after) == ("503", 5.0)
    with pytest.raises(AuthError):
        crm.write_owners(write)
    assert crm.owner_of(rid) is None  # refused requests wrote nothing
    assert crm.write_owners(write)[0].ok
    assert [r.error for r in crm.write_requests()] == [
        None,
        "503",
        "503",
        "INVALID_SESSION_ID",
        None,
    ]
    assert crm.written_ids() == [rid, rid]


def test_rate_limits_carry_retry_after_and_scope_in_each_dialect() -> None:
    for kind, org_code in (("salesforce", "REQUEST_LIMIT_EXCEEDED"), ("hubspot", "DAILY")):
        crm = MemoryCrm(kind)
        crm.fail_rate_limited(30.0, scope="org", op="fetch_records")
        with pytest.raises(RateLimitedError) as ei:
            crm.fetch_records(["x"], [])
        assert (ei.value.code, ei.value.retry_after, ei.value.scope) == (org_code, 30.0, "org")
        crm.fail_rate_limited(2.0, op="check_owners")
        with pytest.raises(RateLimitedError) as ei:
            crm.check_owners(["x"])
        assert ei.value.scope == "request"


def test_any_exception_can_be_raised_and_for_ever_on_any_op() -> None:
    crm = MemoryCrm("hubspot")
    crm.fail_requests(KeyError("bug"), times=None, op="changed_since")
    for _ in range(3):
        with pytest.raises(KeyError):
            list(crm.changed_since(datetime(2000, 1, 1, tzinfo=UTC)))
    assert [r.error for r in crm.requests] == ["KeyError"] * 3
    with pytest.raises(ValueError, match="unknown op"):
        crm.fail_requests(KeyError(), op="delete")  # type: ignore[arg-type]
    crm.clear_faults()
    assert list(crm.changed_since(datetime(2000, 1, 1, tzinfo=UTC))) == []


def test_per_record_failures() -> None:
    crm, owner, parent = _crm()
    inactive = crm.add_user(active=False)
    other_parent = crm.add_parent()
    locked_a, locked_b, free, scripted, poisoned, gone = (
        crm.add_record(None, p)
        for p in (parent, parent, other_parent, other_parent, other_parent, None)
    )
    crm.lock_parent(parent, times=1)
    crm.fail_records([scripted], RetryableError("UNABLE_TO_LOCK_ROW", "x"), times=1)
    crm.poison([poisoned])
    crm.delete(gone)
    batch = [
        OwnerWrite("a", locked_a, owner),
        OwnerWrite("b", locked_b, owner),
        OwnerWrite("c", free, inactive),
        OwnerWrite("d", scripted, owner),
        OwnerWrite("e", poisoned, owner),
        OwnerWrite("f", gone, owner),
        OwnerWrite("g", to_18("003MC9999999999"), owner),
        OwnerWrite("h", free, "005MC9999999999AAA"),
    ]
    first = crm.write_owners(batch)
    codes = [(o.key, type(o.error).__name__, o.error.code if o.error else None) for o in first]
    assert codes == [
        ("a", "RetryableError", "UNABLE_TO_LOCK_ROW"),
        ("b", "RetryableError", "UNABLE_TO_LOCK_ROW"),
        ("c", "PermanentError", "INACTIVE_OWNER_OR_USER"),
        ("d", "RetryableError", "UNABLE_TO_LOCK_ROW"),
        ("e", "PermanentError", "FIELD_CUSTOM_VALIDATION_EXCEPTION"),
        ("f", "PermanentError", "ENTITY_IS_DELETED"),
        ("g", "PermanentError", "INVALID_CROSS_REFERENCE_KEY"),
        ("h", "PermanentError", "INVALID_CROSS_REFERENCE_KEY"),
    ]
    assert all(crm.owner_of(r) is None for r in (locked_a, locked_b, free, scripted, poisoned))
    second = crm.write_owners(batch[:4])  # the lock and the scripted error were for one time
    assert [o.ok for o in second] == [True, True, False, True]


# -- overlaps ---------------------------------------------------------------------------------


def test_a_parent_in_two_requests_in_flight_is_an_overlap() -> None:
    crm, owner, parent = _crm()
    other = crm.add_parent()
    a, b, c = (
        crm.add_record(None, parent),
        crm.add_record(None, parent),
        crm.add_record(None, other),
    )
    seen: list[ServedRequest] = []

    def nested(req: ServedRequest) -> None:
        seen.append(req)
        if len(seen) == 1:
            crm.write_owners([OwnerWrite("c", c, owner)])  # another parent: fine
            crm.write_owners([OwnerWrite("b", b, owner)])  # the same parent: overlap

    crm.on_write = nested
    crm.write_owners([OwnerWrite("a", a, owner)])
    assert crm.overlaps == [Overlap(parent, 1, 3)]
    # one after another is no overlap
    crm.on_write = None
    crm.write_owners([OwnerWrite("a", a, owner)])
    crm.write_owners([OwnerWrite("b", b, owner)])
    assert len(crm.overlaps) == 1


def test_overlaps_between_threads_are_caught() -> None:
    """Two threads write children of one parent; the first holds its request open until the
    second has started (events, no sleeps)."""
    crm, owner, parent = _crm()
    a, b = crm.add_record(None, parent), crm.add_record(None, parent)
    first_in_flight, second_done = threading.Event(), threading.Event()

    def hold(req: ServedRequest) -> None:
        if req.record_ids == (a,):
            first_in_flight.set()
            assert second_done.wait(10)

    crm.on_write = hold
    t = threading.Thread(target=crm.write_owners, args=([OwnerWrite("a", a, owner)],))
    t.start()
    assert first_in_flight.wait(10)
    crm.write_owners([OwnerWrite("b", b, owner)])
    second_done.set()
    t.join(10)
    assert crm.overlaps == [Overlap(parent, 1, 2)]
    assert crm.owner_of(a) == crm.owner_of(b) == owner


def test_one_record_in_two_requests_in_flight_is_an_overlap_even_without_parent() -> None:
    crm = MemoryCrm("hubspot")
    owner, rid = crm.add_user(), crm.add_record()
    done: list[bool] = []

    def again(req: ServedRequest) -> None:
        if not done:
            done.append(True)
            crm.write_owners([OwnerWrite("2", rid, owner)])

    crm.on_write = again
    crm.write_owners([OwnerWrite("1", rid, owner)])
    assert crm.overlaps == [Overlap(rid, 1, 2)]


def test_a_failing_hook_leaves_nothing_in_flight() -> None:
    crm, owner, parent = _crm()
    rid = crm.add_record(None, parent)

    def boom(req: ServedRequest) -> None:
        raise RuntimeError("hook")

    crm.on_write = boom
    with pytest.raises(RuntimeError):
        crm.write_owners([OwnerWrite("k", rid, owner)])
    crm.on_write = None
    crm.write_owners([OwnerWrite("k", rid, owner)])
    assert crm.overlaps == [] and crm.owner_of(rid) == owner
