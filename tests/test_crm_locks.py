"""Salesforce row locks: naive parallel per-record PATCHes collide; parent-grouped batches don't."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from simple_salesforce.exceptions import SalesforceError

from crm_adapters.base import OwnerWrite
from crm_adapters.batching import plan_batches
from crm_adapters.salesforce import SalesforceAdapter, classify_salesforce_exception
from crm_sandboxes import SalesforceSandbox
from tests.helpers.crm_harness import sf_settings


@pytest.fixture
def sb() -> Iterator[SalesforceSandbox]:
    box = SalesforceSandbox(record_work_ms=40.0, lock_wait_s=0.2).start()
    yield box
    box.stop()


def test_naive_parallel_patches_hit_unable_to_lock_row(sb: SalesforceSandbox) -> None:
    owner, account = sb.add_user(), sb.add_account()
    contacts = [sb.add_record("Contact", None, account) for _ in range(16)]
    adapter = SalesforceAdapter(sf_settings(sb))
    sf = adapter.client()
    barrier = threading.Barrier(16)
    codes: list[str] = []
    lock = threading.Lock()

    def patch_one(cid: str) -> None:
        barrier.wait()
        try:
            sf.restful(f"sobjects/Contact/{cid}", method="PATCH", json={"OwnerId": owner})
            code = "ok"
        except SalesforceError as exc:
            code = classify_salesforce_exception(exc).code
        with lock:
            codes.append(code)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(patch_one, contacts))
    assert codes.count("UNABLE_TO_LOCK_ROW") >= 3, codes
    assert sb.counters()["lock_errors"] == codes.count("UNABLE_TO_LOCK_ROW")


def test_plan_batches_and_sequential_composite_writes_never_lock(sb: SalesforceSandbox) -> None:
    owner, account = sb.add_user(), sb.add_account()
    contacts = [sb.add_record("Contact", None, account) for _ in range(16)]
    adapter = SalesforceAdapter(sf_settings(sb))
    writes = [OwnerWrite(f"k{i}", cid, owner, account) for i, cid in enumerate(contacts)]
    outcomes = [o for b in plan_batches(writes, adapter.max_batch) for o in adapter.write_owners(b)]
    assert all(o.ok for o in outcomes)
    assert sb.counters().get("lock_errors", 0) == 0
    assert all(sb.get_record(c)["OwnerId"] == owner for c in contacts)  # type: ignore[index]


def test_parallel_batches_with_disjoint_parents_never_lock(sb: SalesforceSandbox) -> None:
    sb.configure(record_work_ms=10.0)
    owner = sb.add_user()
    writes: list[OwnerWrite] = []
    for a in range(4):
        account = sb.add_account()
        for i in range(12):
            cid = sb.add_record("Contact", None, account)
            writes.append(OwnerWrite(f"{a}-{i}", cid, owner, account))
    adapter = SalesforceAdapter(sf_settings(sb))
    batches = plan_batches(writes, 12)
    assert len(batches) == 4 and all(len({w.parent_id for w in b}) == 1 for b in batches)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(adapter.write_owners, batches))
    assert all(o.ok for r in results for o in r)
    assert sb.counters().get("lock_errors", 0) == 0
