"""Error classification tables: pure functions, Salesforce over `responses`, HubSpot over HTTP."""

# ruff: noqa: E501  (one case per line reads better in these tables)

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
import responses

from crm_adapters.base import (
    AuthError,
    CrmError,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
)
from crm_adapters.hubspot import HubSpotAdapter, HubSpotSettings
from crm_adapters.hubspot_errors import classify_hubspot_http, classify_hubspot_record_error
from crm_adapters.hubspot_limits import refusal_hold, refused_limiters, window_budget
from crm_adapters.salesforce import (
    SalesforceAdapter,
    SalesforceSettings,
    classify_salesforce_http,
    classify_salesforce_record_error,
)
from crm_sandboxes import HubSpotSandbox
from tests.helpers.crm_harness import hs_settings


def _kind(err: CrmError) -> str:
    if isinstance(err, RateLimitedError):
        return f"rate:{err.scope}"
    return {
        RetryableError: "retry",
        PermanentError: "permanent",
        AuthError: "auth",
    }[type(err)]


@pytest.mark.parametrize(
    ("code", "message", "expected"),
    [
        ("UNABLE_TO_LOCK_ROW", "unable to obtain exclusive access", "retry"),
        ("SERVER_UNAVAILABLE", "", "retry"),
        ("UNKNOWN_EXCEPTION", "", "retry"),
        ("REQUEST_LIMIT_EXCEEDED", "TotalRequests Limit exceeded.", "rate:org"),
        ("INVALID_SESSION_ID", "", "auth"),
        ("INVALID_CROSS_REFERENCE_KEY", "invalid cross reference id", "permanent"),
        ("INACTIVE_OWNER_OR_USER", "operation performed with inactive user", "permanent"),
        ("ENTITY_IS_DELETED", "entity is deleted", "permanent"),
        ("FIELD_CUSTOM_VALIDATION_EXCEPTION", "rule", "permanent"),
        ("INSUFFICIENT_ACCESS_OR_READONLY", "", "permanent"),
        ("MALFORMED_ID", "", "permanent"),
        ("CANNOT_INSERT_UPDATE_ACTIVATE_ENTITY", "trigger: UNABLE_TO_LOCK_ROW, unable", "retry"),
        ("CANNOT_INSERT_UPDATE_ACTIVATE_ENTITY", "trigger: some other failure", "permanent"),
        ("SOMETHING_NEW", "", "permanent"),
    ],
)
def test_salesforce_record_errors(code: str, message: str, expected: str) -> None:
    err = classify_salesforce_record_error(code, message)
    assert _kind(err) == expected
    assert err.code in (code, "UNABLE_TO_LOCK_ROW")


@pytest.mark.parametrize(
    ("status", "body", "expected", "code"),
    [
        (401, [{"errorCode": "INVALID_SESSION_ID", "message": "x"}], "auth", "INVALID_SESSION_ID"),
        (403, [{"errorCode": "REQUEST_LIMIT_EXCEEDED", "message": "x"}], "rate:org", None),
        (403, [{"errorCode": "INSUFFICIENT_ACCESS", "message": "x"}], "auth", None),
        (404, [{"errorCode": "NOT_FOUND", "message": "x"}], "permanent", "NOT_FOUND"),
        (400, [{"errorCode": "MALFORMED_QUERY", "message": "x"}], "permanent", None),
        (400, [{"errorCode": "UNABLE_TO_LOCK_ROW", "message": "x"}], "retry", None),
        (429, None, "rate:request", "429"),
        (500, [{"errorCode": "UNKNOWN_EXCEPTION", "message": "x"}], "retry", None),
        (502, "<html>Bad Gateway</html>", "retry", "502"),
        (503, [{"errorCode": "SERVER_UNAVAILABLE", "message": "x"}], "retry", None),
    ],
)
def test_salesforce_http_table(status: int, body: Any, expected: str, code: str | None) -> None:
    err = classify_salesforce_http(status, body, {"Retry-After": "3"})
    assert _kind(err) == expected
    if code:
        assert err.code == code


_NOW = datetime(2024, 5, 1, 23, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected", "retry_after"),
    [
        (401, {"category": "INVALID_AUTHENTICATION"}, {}, "auth", None),
        (403, {"category": "MISSING_SCOPES"}, {}, "auth", None),
        (404, {"category": "OBJECT_NOT_FOUND"}, {}, "permanent", None),
        (400, {"category": "VALIDATION_ERROR"}, {}, "permanent", None),
        (429, {"policyName": "TEN_SECONDLY_ROLLING"}, {}, "rate:request", 1.0),
        (429, {"policyName": "TEN_SECONDLY_ROLLING"}, {"Retry-After": "4"}, "rate:request", 4.0),
        (429, {"policyName": "SECONDLY"}, {}, "rate:request", 1.0),
        (429, {"policyName": "DAILY"}, {}, "rate:org", 3600.0),
        (429, "not json", {}, "rate:request", 1.0),
        (500, {"category": "INTERNAL_ERROR"}, {}, "retry", None),
        (502, b"<html>bad gateway</html>", {}, "retry", None),
        (503, None, {"retry-after": "2"}, "retry", 2.0),
        (0, None, {}, "retry", None),
    ],
)
def test_hubspot_http_table(
    status: int, body: Any, headers: dict[str, str], expected: str, retry_after: float | None
) -> None:
    err = classify_hubspot_http(status, body, headers, now=_NOW)
    assert _kind(err) == expected
    if retry_after is not None:
        assert isinstance(err, RetryableError) and err.retry_after == pytest.approx(retry_after)


@pytest.mark.parametrize(
    ("category", "expected"),
    [
        ("OBJECT_NOT_FOUND", "permanent"),
        ("VALIDATION_ERROR", "permanent"),
        ("RATE_LIMITS", "rate:request"),
        ("INTERNAL_ERROR", "retry"),
        ("", "permanent"),
    ],
)
def test_hubspot_record_errors(category: str, expected: str) -> None:
    assert _kind(classify_hubspot_record_error(category, "m")) == expected


# ---------------------------------------------------------------- Salesforce over `responses`
SF = "https://acme.my.salesforce.test"
COMPOSITE = f"{SF}/services/data/v62.0/composite/sobjects"
TOKEN = f"{SF}/services/oauth2/token"


def _sf(method: str = "session") -> SalesforceAdapter:
    auth = (
        {"method": "session", "access_token": "tok"}
        if method == "session"
        else {"method": "client_credentials", "client_id": "c", "client_secret": "s"}
    )
    return SalesforceAdapter(SalesforceSettings(instance_url=SF, auth=auth, timeout=2))


WRITE = [OwnerWrite("k1", "003000000000001AAA", "005000000000001AAA", "001000000000001AAA")]


@responses.activate
@pytest.mark.parametrize(
    ("status", "body", "expected", "code"),
    [
        (401, [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}], "auth", "INVALID_SESSION_ID"),
        (403, [{"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}], "rate:org", "REQUEST_LIMIT_EXCEEDED"),
        (403, [{"message": "API is disabled", "errorCode": "API_DISABLED_FOR_ORG"}], "auth", "API_DISABLED_FOR_ORG"),
        (404, [{"message": "The requested resource does not exist", "errorCode": "NOT_FOUND"}], "permanent", "NOT_FOUND"),
        (429, [{"message": "slow down", "errorCode": "REQUEST_LIMIT_EXCEEDED"}], "rate:org", "REQUEST_LIMIT_EXCEEDED"),
        (500, [{"message": "boom", "errorCode": "UNKNOWN_EXCEPTION"}], "retry", "UNKNOWN_EXCEPTION"),
        (502, "Bad Gateway", "retry", "502"),
        (503, [{"message": "down", "errorCode": "SERVER_UNAVAILABLE"}], "retry", "SERVER_UNAVAILABLE"),
    ],
)  # fmt: skip
def test_salesforce_whole_request_errors(status: int, body: Any, expected: str, code: str) -> None:
    kw: dict[str, Any] = {"json": body} if not isinstance(body, str) else {"body": body}
    responses.add(responses.PATCH, COMPOSITE, status=status, **kw)
    with pytest.raises(CrmError) as ei:
        _sf().write_owners(WRITE)
    assert _kind(ei.value) == expected
    assert ei.value.code == code


@responses.activate
@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (requests.exceptions.ReadTimeout("read timed out"), "timeout"),
        (requests.exceptions.ConnectTimeout("connect timed out"), "timeout"),
        (requests.exceptions.ConnectionError("refused"), "connection"),
    ],
)
def test_salesforce_transport_errors(exc: Exception, code: str) -> None:
    responses.add(responses.PATCH, COMPOSITE, body=exc)
    with pytest.raises(RetryableError) as ei:
        _sf().write_owners(WRITE)
    assert ei.value.code == code


@responses.activate
def test_salesforce_per_record_results_and_limit_header() -> None:
    responses.add(
        responses.PATCH,
        COMPOSITE,
        json=[
            {"id": "003000000000001AAA", "success": True, "errors": []},
            {
                "id": "003000000000002AAA",
                "success": False,
                "errors": [
                    {
                        "statusCode": "UNABLE_TO_LOCK_ROW",
                        "message": "unable to obtain exclusive access to this record or 1 "
                        "records: 003000000000002AAA",
                        "fields": [],
                    }
                ],
            },
        ],
        headers={"Sforce-Limit-Info": "api-usage=25/15000"},
    )
    a = _sf()
    out = a.write_owners([WRITE[0], OwnerWrite("k2", "003000000000002AAA", "005000000000001AAA")])
    assert out[0].ok and not out[1].ok and isinstance(out[1].error, RetryableError)
    assert a.usage()["api_usage"] == {"used": 25, "total": 15000}
    sent = responses.calls[0].request
    assert sent.headers["Authorization"] == "Bearer tok"


@responses.activate
def test_salesforce_refreshes_once_on_401_then_raises_auth() -> None:
    responses.add(responses.POST, TOKEN, json={"access_token": "t1", "instance_url": SF})
    expired = [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}]
    responses.add(responses.PATCH, COMPOSITE, status=401, json=expired)
    with pytest.raises(AuthError):
        _sf("client_credentials").write_owners(WRITE)
    assert [c.request.method for c in responses.calls] == ["POST", "PATCH", "POST", "PATCH"]


@responses.activate
def test_salesforce_bad_credentials_is_auth_error() -> None:
    responses.add(
        responses.POST,
        TOKEN,
        status=400,
        json={"error": "invalid_client", "error_description": "invalid client credentials"},
    )
    with pytest.raises(AuthError) as ei:
        _sf("client_credentials").write_owners(WRITE)
    assert ei.value.code == "invalid_client"


@responses.activate
def test_salesforce_token_endpoint_outage_is_retryable() -> None:
    responses.add(responses.POST, TOKEN, status=503, body="down")
    with pytest.raises(RetryableError):
        _sf("client_credentials").write_owners(WRITE)


# ---------------------------------------------------------------- HubSpot over real HTTP
# hubspot-api-client talks urllib3 directly, which `responses` cannot intercept; the same table
# runs through the real client against the sandbox's scripted replies instead.


@pytest.fixture(scope="module")
def hs() -> Iterator[HubSpotSandbox]:
    sb = HubSpotSandbox(limit_per_10s=10_000, search_per_s=None).start()
    yield sb
    sb.stop()


def _rate_body(policy: str) -> dict[str, str]:
    return {
        "status": "error",
        "message": f"You have reached your {policy.lower()} limit.",
        "errorType": "RATE_LIMIT",
        "correlationId": "c0ffee",
        "policyName": policy,
    }


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected", "code"),
    [
        (401, {"status": "error", "category": "INVALID_AUTHENTICATION", "message": "m"}, {}, "auth", "INVALID_AUTHENTICATION"),
        (403, {"status": "error", "category": "MISSING_SCOPES", "message": "m"}, {}, "auth", "MISSING_SCOPES"),
        (404, {"status": "error", "category": "OBJECT_NOT_FOUND", "message": "m"}, {}, "permanent", "OBJECT_NOT_FOUND"),
        (429, _rate_body("TEN_SECONDLY_ROLLING"), {}, "rate:request", "TEN_SECONDLY_ROLLING"),
        (429, _rate_body("TEN_SECONDLY_ROLLING"), {"Retry-After": "3"}, "rate:request", "TEN_SECONDLY_ROLLING"),
        (429, _rate_body("SECONDLY"), {}, "rate:request", "SECONDLY"),
        (429, _rate_body("DAILY"), {}, "rate:org", "DAILY"),
        (500, {"status": "error", "category": "INTERNAL_ERROR", "message": "m"}, {}, "retry", "INTERNAL_ERROR"),
        (502, b"<html>Bad Gateway</html>", {}, "retry", "502"),
        (503, b"", {}, "retry", "503"),
    ],
)  # fmt: skip
def test_hubspot_whole_request_errors_over_http(
    hs: HubSpotSandbox,
    status: int,
    body: Any,
    headers: dict[str, str],
    expected: str,
    code: str,
) -> None:
    a = HubSpotAdapter(hs_settings(hs))
    rid, owner = hs.add_record(), hs.add_owner()
    hs.inject_failures(1, status, body, headers)
    with pytest.raises(CrmError) as ei:
        a.write_owners([OwnerWrite("k", rid, owner)])
    assert _kind(ei.value) == expected
    assert ei.value.code == code
    if "Retry-After" in headers:
        assert isinstance(ei.value, RetryableError) and ei.value.retry_after == 3.0
    held = a.usage()["held_s"]
    assert isinstance(held, float)
    if expected == "rate:request":
        # every call on the account waits out the refusal: Retry-After, else the policy's
        # window (SECONDLY: 1 s; TEN_SECONDLY_ROLLING: 10 s, padded as the limiter is)
        low, high = {"SECONDLY": (0.5, 1.0)}.get(code, (2.0, 3.0) if headers else (9.5, 10.6))
        assert low < held <= high, held
        if held > 3.0:
            return  # the retry would only wait; the table's other rows cover it
    else:
        assert held == 0.0
    assert a.write_owners([OwnerWrite("k", rid, owner)])[0].ok


@pytest.mark.parametrize(
    ("policy", "held", "search_held"),
    [
        ("SECONDLY", (0.0, 0.0), (0.5, 1.0)),  # the searches' own limit: searches wait
        ("TEN_SECONDLY_ROLLING", (9.5, 10.6), (9.5, 10.6)),  # the account's: every call
    ],
)
def test_a_refused_search_holds_the_calls_that_share_the_refused_budget(
    hs: HubSpotSandbox,
    policy: str,
    held: tuple[float, float],
    search_held: tuple[float, float],
) -> None:
    a = HubSpotAdapter(hs_settings(hs))
    hs.add_record()
    hs.inject_failures(1, 429, _rate_body(policy), {}, path_contains="/search")
    with pytest.raises(RetryableError) as ei:
        list(a.changed_since(datetime(2020, 1, 1, tzinfo=UTC)))
    assert (ei.value.code, ei.value.scope) == (policy, "request")
    u = a.usage()
    for key, (low, high) in (("held_s", held), ("search_held_s", search_held)):
        value = u[key]
        assert isinstance(value, float)
        assert value == 0.0 if high == 0.0 else low < value <= high, (key, value)


def test_records_refused_for_rate_limits_hold_the_account(hs: HubSpotSandbox) -> None:
    """A 207 whose errors refuse records for RATE_LIMITS: those records fail as rate limited
    (retried later), the others are written, and every call on the account but searches
    (their own budget) waits a second before the retry instead of being refused again."""
    a = HubSpotAdapter(hs_settings(hs))
    rids, owner = [hs.add_record(), hs.add_record()], hs.add_owner()
    body = {
        "status": "COMPLETE",
        "results": [{"id": rids[0], "properties": {"hubspot_owner_id": owner}}],
        "errors": [
            {
                "status": "error",
                "category": "RATE_LIMITS",
                "message": "You have reached your secondly limit.",
                "context": {"ids": [rids[1]]},
            }
        ],
    }
    hs.inject_failures(1, 207, body, {}, path_contains="batch/update")
    got = a.write_owners([OwnerWrite("k0", rids[0], owner), OwnerWrite("k1", rids[1], owner)])
    assert got[0].ok and not got[1].ok
    assert isinstance(got[1].error, RateLimitedError) and got[1].error.code == "RATE_LIMITS"
    u = a.usage()
    held = u["held_s"]
    assert isinstance(held, float) and 0.5 < held <= 1.0, held
    assert u["search_held_s"] == 0.0


def test_refused_limiters() -> None:
    assert refused_limiters("TEN_SECONDLY_ROLLING", search=False) == ("general",)
    assert refused_limiters("SECONDLY", search=False) == ("general",)
    assert refused_limiters("SECONDLY", search=True) == ("search",)
    assert refused_limiters("TEN_SECONDLY_ROLLING", search=True) == ("search", "general")
    assert refused_limiters("SOMETHING_NEW", search=True) == ("search", "general")


def test_hubspot_timeout_and_dropped_connection(hs: HubSpotSandbox) -> None:
    a = HubSpotAdapter(hs_settings(hs, timeout=0.2))
    rid, owner = hs.add_record(), hs.add_owner()
    hs.drop_connections(1)
    with pytest.raises(RetryableError) as ei:
        a.write_owners([OwnerWrite("k", rid, owner)])
    assert ei.value.code == "connection"
    hs.set_latency(0.5)
    try:
        with pytest.raises(RetryableError) as ei:
            a.fetch_records([rid], [])
        assert ei.value.code == "timeout"
    finally:
        hs.set_latency(0)


def test_hubspot_connection_refused() -> None:
    sb = HubSpotSandbox().start()
    url = sb.url
    sb.stop()
    a = HubSpotAdapter(HubSpotSettings(access_token="t", base_url=url, timeout=1))
    with pytest.raises(RetryableError) as ei:
        a.check_owners(["1"])
    assert ei.value.code == "connection"


def test_window_budget_reads_the_ten_second_headers() -> None:
    h = {
        "x-hubspot-ratelimit-interval-milliseconds": "10000",
        "x-hubspot-ratelimit-max": "190",
        "x-hubspot-ratelimit-remaining": "12",
    }
    assert window_budget(h) == (190, 12)
    assert window_budget({k: v for k, v in h.items() if "interval" not in k}) == (190, 12)
    for bad in (
        {**h, "x-hubspot-ratelimit-interval-milliseconds": "1000"},  # another window
        {**h, "x-hubspot-ratelimit-max": "lots"},
        {**h, "x-hubspot-ratelimit-remaining": "-1"},
        {**h, "x-hubspot-ratelimit-max": "0"},
        {k: v for k, v in h.items() if "remaining" not in k},
        {},
    ):
        assert window_budget(bad) is None, bad


def test_refusal_hold_prefers_the_servers_word() -> None:
    assert refusal_hold("TEN_SECONDLY_ROLLING", 3.0, 10.55) == 3.0
    assert refusal_hold("SECONDLY", 0.0, 10.55) == 0.0
    assert refusal_hold("SECONDLY", None, 10.55) == 1.0
    assert refusal_hold("TEN_SECONDLY_ROLLING", None, 10.55) == 10.55
    assert refusal_hold("429", None, 1.05) == 1.05


def test_a_retry_after_that_is_not_a_finite_time_is_not_believed() -> None:
    body = {"status": "error", "policyName": "TEN_SECONDLY_ROLLING", "message": "m"}
    for value in ("inf", "nan", "-inf"):
        err = classify_hubspot_http(429, body, {"Retry-After": value})
        assert isinstance(err, RateLimitedError) and err.retry_after == 1.0, value
