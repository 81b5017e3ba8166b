"""Sandbox control surfaces, auth flows, HubSpot limits and search windowing, standalone serve."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from crm_adapters.base import AuthError, OwnerWrite, PermanentError, RateLimitedError
from crm_adapters.hubspot import HubSpotAdapter, HubSpotSettings
from crm_adapters.salesforce import SalesforceAdapter, SalesforceSettings
from crm_adapters.salesforce_ids import to_18
from crm_sandboxes import HubSpotSandbox, SalesforceSandbox, make_sandbox
from testbed.waiting import between_stamps, wait_until
from tests.helpers.crm_harness import hs_settings, sf_settings
from tests.helpers.ports import free_port


@pytest.fixture
def sf() -> Iterator[SalesforceSandbox]:
    sb = SalesforceSandbox(record_work_ms=0).start()
    yield sb
    sb.stop()


@pytest.fixture
def hs() -> Iterator[HubSpotSandbox]:
    sb = HubSpotSandbox(search_per_s=None).start()
    yield sb
    sb.stop()


# ---------------------------------------------------------------- control over HTTP
@pytest.mark.parametrize("kind", ["salesforce", "hubspot"])
def test_http_control_surface(kind: str) -> None:
    sb = make_sandbox(kind).start()
    try:
        u = sb.url + "/_sandbox"
        if kind == "salesforce":
            seeded = requests.post(
                f"{u}/seed",
                json={"users": [{"name": "A"}], "accounts": [{}], "records": [{"object": "Lead"}]},
                timeout=5,
            ).json()
            assert len(seeded["users"]) == 1 and len(seeded["records"]) == 1
        else:
            seeded = requests.post(
                f"{u}/seed", json={"owners": [{}], "records": [{"owner_id": "101"}]}, timeout=5
            ).json()
            assert seeded["owners"] == ["101"]
        rid = seeded["records"][0]
        assert requests.get(f"{u}/records/{rid}", timeout=5).status_code == 200
        assert len(requests.get(f"{u}/records", timeout=5).json()) >= 1
        r = requests.post(f"{u}/faults", json={"fail_next": 1, "status": 502}, timeout=5)
        assert r.json() == {"ok": True}
        api = "/services/data/v62.0/query" if kind == "salesforce" else "/crm/v3/owners"
        assert requests.get(sb.url + api, timeout=5).status_code == 502
        assert requests.get(sb.url + api, timeout=5).status_code == 401  # no token
        assert requests.post(f"{u}/config", json={"nope": 1}, timeout=5).status_code == 400
        knob = {"lock_wait_s": 0.5} if kind == "salesforce" else {"limit_per_10s": 7}
        assert requests.post(f"{u}/config", json=knob, timeout=5).status_code == 200
        counters = requests.get(f"{u}/counters", timeout=5).json()
        assert counters["injected"] == 1 and counters["auth_failures"] == 1
        requests.post(f"{u}/reset", timeout=5)
        assert requests.get(f"{u}/records", timeout=5).json() == []
    finally:
        sb.stop()


@pytest.mark.parametrize("kind", ["salesforce", "hubspot"])
def test_an_answer_leaves_in_one_write(kind: str) -> None:
    """Head and body of an answer come in one piece, on a kept-alive connection too. Written
    apart, with Nagle's algorithm on, the body waited for the client's delayed ACK: every
    call of the adapters took 44 ms, whatever it carried (the runs of 2026-12-04 12:23 UTC in
    BENCHMARKS.md's git history, "The simulators' 44 ms a call")."""
    sb = make_sandbox(kind).start()
    host, port = sb.url.removeprefix("http://").split(":")
    request = f"GET /_sandbox/counters HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    try:
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            for _ in range(3):
                conn.sendall(request)
                first = conn.recv(1 << 16)  # what had arrived when the first bytes did
                head, _, body = first.partition(b"\r\n\r\n")
                declared = re.search(rb"(?i)content-length: (\d+)", head)
                assert head.startswith(b"HTTP/1.1 200") and declared is not None
                assert len(body) == int(declared.group(1)) > 0, "the body came apart"
    finally:
        sb.stop()


def test_serve_standalone() -> None:
    port = free_port()
    code = f"from crm_sandboxes import serve; serve('hubspot', '127.0.0.1', {port})"
    proc = subprocess.Popen([sys.executable, "-c", code])

    def counters() -> requests.Response | None:  # a readiness probe
        assert proc.poll() is None, f"the sandbox exited with {proc.returncode}"
        try:
            return requests.get(f"http://127.0.0.1:{port}/_sandbox/counters", timeout=1)
        except requests.ConnectionError:
            return None

    try:
        r = wait_until(counters, 15, "the standalone sandbox to answer", interval=0.05)
        assert r.json()["total_calls"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=5)


# ---------------------------------------------------------------- Salesforce auth flows
def test_sf_password_and_jwt_and_session_flows(sf: SalesforceSandbox) -> None:
    uid = sf.add_user()
    pw = {
        "method": "password",
        "username": sf.username,
        "password": sf.password,
        "security_token": sf.security_token,
    }
    assert SalesforceAdapter(sf_settings(sf, auth=pw)).check_owners([uid]) == {uid: None}
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    jwt_auth = {
        "method": "jwt",
        "client_id": sf.client_id,
        "username": sf.username,
        "private_key": pem,
    }
    assert SalesforceAdapter(sf_settings(sf, auth=jwt_auth)).check_owners([uid]) == {uid: None}
    session = {"method": "session", "access_token": sf.session_token}
    a = SalesforceAdapter(sf_settings(sf, auth=session))
    assert a.check_owners([uid]) == {uid: None}
    sf.expire_tokens()
    with pytest.raises(AuthError):
        a.check_owners([uid])
    bad = dict(pw, password="wrong")
    with pytest.raises(AuthError):
        SalesforceAdapter(sf_settings(sf, auth=bad)).check_owners([uid])


def test_sf_refreshes_expired_token(sf: SalesforceSandbox) -> None:
    uid = sf.add_user()
    a = SalesforceAdapter(sf_settings(sf))
    assert a.check_owners([uid]) == {uid: None}
    sf.expire_tokens()
    assert a.check_owners([uid]) == {uid: None}
    assert a.usage()["token_fetches"] == 2


def test_sf_ids_are_valid_and_either_form_is_accepted(sf: SalesforceSandbox) -> None:
    uid, uid2, acc = sf.add_user(), sf.add_user(), sf.add_account()
    rid = sf.add_record("Contact", None, acc[:15])
    other = sf.add_record("Contact")
    for x in (uid, uid2, acc, rid, other):
        assert len(x) == 18 and to_18(x[:15]) == x  # a real checksum, not a fixed suffix
    assert sf.get_record(rid) == sf.get_record(rid[:15]) == sf.get_record(rid.lower())
    assert sf.get_record(rid)["AccountId"] == acc  # stored in the 18-character form

    api = sf.url + "/services/data/v62.0"
    auth = {"Authorization": f"Bearer {sf.session_token}"}

    def soql(q: str) -> list[str]:
        r = requests.get(f"{api}/query", params={"q": q}, headers=auth, timeout=5)
        assert r.status_code == 200, r.text
        return [row["Id"] for row in r.json()["records"]]

    got = requests.get(f"{api}/sobjects/Contact/{rid[:15]}", headers=auth, timeout=5)
    assert got.status_code == 200 and got.json()["Id"] == rid
    got = requests.get(f"{api}/sobjects/Contact/{rid.upper()}", headers=auth, timeout=5)
    assert got.status_code == 200 and got.json()["Id"] == rid

    patch = requests.patch(
        f"{api}/sobjects/Contact/{rid.lower()}", json={"OwnerId": uid[:15]}, headers=auth, timeout=5
    )
    assert patch.status_code == 204
    assert sf.get_record(rid)["OwnerId"] == uid

    body = {
        "allOrNone": False,
        "records": [
            {"attributes": {"type": "Contact"}, "id": other[:15], "OwnerId": uid2.upper()},
            {"attributes": {"type": "Contact"}, "id": "003000000000000BAA", "OwnerId": uid},
        ],
    }
    res = requests.patch(f"{api}/composite/sobjects", json=body, headers=auth, timeout=5).json()
    assert res[0] == {"id": other, "success": True, "errors": []}
    assert res[1]["errors"][0]["statusCode"] == "MALFORMED_ID"  # the suffix marks a digit
    assert sf.get_record(other)["OwnerId"] == uid2

    assert soql(f"SELECT Id FROM Contact WHERE Id = '{rid[:15]}'") == [rid]
    assert sorted(
        soql(f"SELECT Id FROM Contact WHERE Id IN ('{rid.lower()}', '{other[:15]}')")
    ) == (sorted([rid, other]))
    assert soql(f"SELECT Id FROM Contact WHERE OwnerId = '{uid2[:15]}'") == [other]
    assert soql(f"SELECT Id FROM User WHERE Id IN ('{uid.upper()}')") == [uid]

    a = SalesforceAdapter(sf_settings(sf))
    assert [r.crm_id for r in a.fetch_records([rid[:15], other.lower()], [])] == [rid, other]
    assert a.check_owners([uid[:15], uid2.lower()]) == {uid[:15]: None, uid2.lower(): None}
    sf.poison([rid[:15]])
    [outcome] = a.write_owners([OwnerWrite("k", rid, uid2, acc)])
    assert outcome.error is not None and outcome.error.code == "FIELD_CUSTOM_VALIDATION_EXCEPTION"


def test_sf_limits_and_bad_queries(sf: SalesforceSandbox) -> None:
    uid, acc = sf.add_user(), sf.add_account()
    rid = sf.add_record("Contact", None, acc)
    a = SalesforceAdapter(sf_settings(sf))
    with pytest.raises(ValueError):
        a.fetch_records([rid], ["Bad Field"])
    with pytest.raises(PermanentError) as ei:
        a.fetch_records([rid], ["NoSuchField__c"])
    assert ei.value.code == "INVALID_FIELD"
    sf.configure(max_collection=1)
    with pytest.raises(PermanentError) as ei:
        a.write_owners([OwnerWrite("a", rid, uid, acc), OwnerWrite("b", rid, uid, acc)])
    assert ei.value.code == "EXCEEDED_ID_LIMIT"
    sf.configure(api_limit=0)
    with pytest.raises(RateLimitedError) as ei2:
        a.write_owners([OwnerWrite("a", rid, uid, acc)])
    assert ei2.value.scope == "org" and ei2.value.code == "REQUEST_LIMIT_EXCEEDED"
    assert a.usage()["limit_info"] is not None


def test_adapter_for_builds_each_crm_from_its_config(
    sf: SalesforceSandbox, hs: HubSpotSandbox
) -> None:
    from connector.shell.adapters import adapter_for
    from testbed.crm_orgs import hubspot_org, salesforce_org

    sfa = adapter_for(salesforce_org(sf, [to_18("005000000000001")]))
    assert isinstance(sfa, SalesforceAdapter) and sfa.check_owners([]) == {}
    hsa = adapter_for(hubspot_org(hs, ["1"]))
    assert isinstance(hsa, HubSpotAdapter) and hsa.check_owners(["1"]) == {"1": "not found"}
    assert "sandbox-token" not in repr(hsa.settings) and "secret" not in repr(sfa.settings)


# ---------------------------------------------------------------- HubSpot limits
def _spend_window(settings: HubSpotSettings, calls: int) -> None:
    """Another app on the same account spends `calls` of its ten-second window."""
    for _ in range(calls):
        r = requests.get(
            f"{settings.base_url}/crm/v3/owners",
            headers={"Authorization": f"Bearer {settings.access_token}"},
            timeout=5,
        )
        assert r.status_code == 200, r.status_code


def test_hs_real_limit_is_learned_from_the_headers(hs: HubSpotSandbox) -> None:
    hs.configure(limit_per_10s=3)  # the adapter is configured for 100
    settings = hs_settings(hs)
    _spend_window(settings, 1)
    a = HubSpotAdapter(settings)
    a.fetch_records(["1"], [])
    u = a.usage()
    assert u["limit_per_10s"] == 100 and u["effective_limit_per_10s"] == 3
    # the other app's call is counted too: one call of its own, two counted
    assert u["used_in_window"] == 2 and u["held_s"] == 0.0
    a.fetch_records(["1"], [])
    assert a.usage()["used_in_window"] == 3  # a third call would wait here, not be refused
    assert hs.counters().get("rate_limited", 0) == 0


def test_hs_rolling_limit_429_holds_the_account_for_a_window(hs: HubSpotSandbox) -> None:
    hs.configure(limit_per_10s=3)
    settings = hs_settings(hs)
    _spend_window(settings, 3)
    a = HubSpotAdapter(settings)
    with pytest.raises(RateLimitedError) as ei:
        a.fetch_records(["1"], [])
    assert ei.value.scope == "request" and ei.value.code == "TEN_SECONDLY_ROLLING"
    # the records are retried after the hold, not claimed again to wait in it
    assert ei.value.retry_after is not None and 10.0 < ei.value.retry_after <= 10.6
    assert hs.counters()["rate_limited_ten_secondly_rolling"] == 1
    u = a.usage()
    headers = u["rate_limit_headers"]
    assert isinstance(headers, dict) and headers["x-hubspot-ratelimit-remaining"] == "0"
    # no Retry-After: the next call on this account waits a whole (padded) window
    held = u["held_s"]
    assert isinstance(held, float) and 9.0 < held <= 10.6
    # a refusal's counts are not learned from: the hold alone decides
    assert u["effective_limit_per_10s"] == 100


def test_hs_429_with_retry_after_holds_for_that_long(hs: HubSpotSandbox) -> None:
    body = {"status": "error", "message": "slow down", "policyName": "TEN_SECONDLY_ROLLING"}
    hs.inject_failures(1, 429, body, headers={"Retry-After": "3"})
    a = HubSpotAdapter(hs_settings(hs))
    with pytest.raises(RateLimitedError) as ei:
        a.fetch_records(["1"], [])
    assert ei.value.retry_after == 3.0
    held = a.usage()["held_s"]
    assert isinstance(held, float) and 2.0 < held <= 3.0


@pytest.mark.parametrize("value", ["inf", "nan", "0", "Wed, 21 Oct 2026 07:28:00 GMT", "999"])
def test_hs_429_with_a_retry_after_that_is_no_usable_time_holds_a_window(
    hs: HubSpotSandbox, value: str
) -> None:
    body = {"status": "error", "message": "slow down", "policyName": "TEN_SECONDLY_ROLLING"}
    hs.inject_failures(1, 429, body, headers={"Retry-After": value})
    a = HubSpotAdapter(hs_settings(hs))
    with pytest.raises(RateLimitedError) as ei:
        a.fetch_records(["1"], [])
    held = a.usage()["held_s"]
    # not a time, or longer than a window (999 s): one window, so that a write waiting here
    # still ends within its claim's lease
    assert isinstance(held, float) and 10.0 < held <= 10.6, held
    assert ei.value.retry_after is not None and 10.0 < ei.value.retry_after <= 10.6


def test_hs_daily_limit_is_org_scoped(hs: HubSpotSandbox) -> None:
    hs.configure(daily_limit=1)
    a = HubSpotAdapter(hs_settings(hs))
    a.fetch_records(["1"], [])
    with pytest.raises(RateLimitedError) as ei:
        a.fetch_records(["1"], [])
    assert ei.value.scope == "org" and ei.value.retry_after is not None
    assert 0 < ei.value.retry_after <= 86_400


def test_hs_client_budget_blocks_instead_of_429(hs: HubSpotSandbox) -> None:
    hs.configure(search_per_s=2)
    a = HubSpotAdapter(hs_settings(hs, search_per_s=2.0))
    owner = hs.add_owner()
    since = between_stamps()
    for _ in range(5):
        hs.add_record(owner_id=owner)
    t0 = time.monotonic()
    pages = list(a.changed_since(since, page_size=1))  # 6 searches at 2/s: must pace, not 429
    assert sum(len(p) for p in pages) == 5
    assert time.monotonic() - t0 >= 1.0
    assert hs.counters().get("rate_limited", 0) == 0


def test_hs_whole_batch_validation_error_is_bisected(hs: HubSpotSandbox) -> None:
    owner = hs.add_owner()
    ids = [hs.add_record() for _ in range(4)]
    a = HubSpotAdapter(hs_settings(hs))
    body = {
        "status": "error",
        "message": "Property values were not valid",
        "category": "VALIDATION_ERROR",
    }
    hs.inject_failures(1, 400, body)
    out = a.write_owners([OwnerWrite(str(i), r, owner) for i, r in enumerate(ids)])
    assert all(o.ok for o in out)
    assert (
        hs.counters()["calls"]["POST contacts/batch/update"] == 2
    )  # 400, then 2 halves (1 injected)


# ---------------------------------------------------------------- HubSpot search windowing
def test_hs_search_cap_is_400_in_sandbox(hs: HubSpotSandbox) -> None:
    hs.configure(search_cap=400)
    for _ in range(5):
        hs.add_record()
    r = requests.post(
        f"{hs.url}/crm/v3/objects/contacts/search",
        json={"limit": 200, "after": "400"},
        headers={"Authorization": "Bearer sandbox-token"},
        timeout=5,
    )
    assert r.status_code == 400 and r.json()["category"] == "VALIDATION_ERROR"


def test_hs_changed_since_moves_window_past_cap(hs: HubSpotSandbox) -> None:
    hs.configure(search_cap=300)
    base = 1_700_000_000_000
    # 1000 records over 250 distinct ms (4 per ms) so windows restart inside a tie
    ids = [hs.add_record(modified_ms=base + i // 4) for i in range(1000)]
    hs.add_record(modified_ms=base - 5)  # before the window
    a = HubSpotAdapter(hs_settings(hs, search_result_cap=300))
    since = datetime.fromtimestamp(base / 1000, tz=UTC)
    pages = list(a.changed_since(since, page_size=100))
    got = [r.crm_id for p in pages for r in p]
    assert sorted(got, key=int) == ids and len(got) == len(set(got))
    stamps = [r.modified_at for p in pages for r in p]
    assert stamps == sorted(stamps)
    assert hs.counters().get("search_cap_errors", 0) == 0
    until = datetime.fromtimestamp((base + 10) / 1000, tz=UTC)
    assert sum(len(p) for p in a.changed_since(since, until)) == 40


def test_hs_leads_object_uses_hs_lastmodifieddate(hs: HubSpotSandbox) -> None:
    owner = hs.add_owner()
    since = between_stamps()
    lid = hs.add_record("leads", owner)
    a = HubSpotAdapter(hs_settings(hs, object="leads"))
    (page,) = list(a.changed_since(since))
    assert page[0].crm_id == lid and page[0].fields["hubspot_owner_id"] == owner
    assert a.write_owners([OwnerWrite("k", lid, owner)])[0].ok
    assert HubSpotSettings(access_token="x", object="leads").modified_property == (
        "hs_lastmodifieddate"
    )


def test_sf_settings_defaults() -> None:
    s = SalesforceSettings(instance_url="https://x", auth={"method": "session"}, object="Contact")
    assert s.effective_parent_field == "AccountId"
    lead = SalesforceSettings(instance_url="https://x", auth={"method": "session"})
    assert lead.effective_parent_field is None
    with pytest.raises(ValueError):
        SalesforceAdapter(SalesforceSettings(instance_url="https://x", auth={"method": "magic"}))
