"""HubSpot v3 signatures: fixed vectors, rotation, every rejection code, fuzz."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.intake.signatures import SignatureError, normalize_v3_uri, sign_v3, verify_v3

SECRET = "yyyyyyyy-yyyy-yyyy-yyyy-yyyyyyyyyyyy"
URI = "https://example.com/hubspot/webhooks?portal=62515"
BODY = (
    b'[{"eventId":1,"subscriptionId":12345,"portalId":62515,"occurredAt":1564113600000,'
    b'"subscriptionType":"contact.creation","attemptNumber":0,"objectId":123,'
    b'"changeSource":"CRM","changeFlag":"NEW","appId":54321}]'
)
TS = 1_700_000_000_000
# Computed once with hmac/base64 directly and pasted: base64(HMAC-SHA256(SECRET,
# "POST" + URI + BODY + "1700000000000")).
EXPECTED = "k+1jN99I/mQ6h0fE9+opeZF5vd/NmoVdoBiGbBprlPA="
# Same, key "another-secret", empty body, over the decoded URI below.
DECODED_URI = "https://example.com/hooks/a:b@c!d$e'f(g)h*i,j;k?x=1"
ENCODED_URI = "https://example.com/hooks/a%3Ab%40c%21d%24e%27f%28g%29h%2Ai%2Cj%3Bk%3Fx=1"
EXPECTED_DECODED = "xaY50oJfSBTroa/OdoOyoq71mi+MFYCFjrjs/b/NoFM="


def _verify(**overrides: object) -> None:
    kwargs: dict[str, object] = {
        "secrets": [SECRET],
        "method": "POST",
        "uri": URI,
        "body": BODY,
        "signature": EXPECTED,
        "timestamp": str(TS),
        "now_ms": TS + 1_000,
    }
    kwargs.update(overrides)
    verify_v3(**kwargs)  # type: ignore[arg-type]


def _error(**overrides: object) -> SignatureError:
    with pytest.raises(SignatureError) as info:
        _verify(**overrides)
    assert info.value.http_status == 401
    return info.value


def test_sign_matches_hand_computed_hmac() -> None:
    message = b"POST" + URI.encode() + BODY + str(TS).encode()
    by_hand = base64.b64encode(hmac.new(SECRET.encode(), message, hashlib.sha256).digest())
    assert sign_v3(SECRET, "POST", URI, BODY, TS) == by_hand.decode()


def test_sign_matches_pasted_vector() -> None:
    assert sign_v3(SECRET, "POST", URI, BODY, TS) == EXPECTED


def test_uri_escapes_are_decoded_as_hubspot_documents() -> None:
    assert normalize_v3_uri(ENCODED_URI) == DECODED_URI
    assert normalize_v3_uri(ENCODED_URI.lower()) == DECODED_URI.lower()
    # Escapes outside HubSpot's list stay as they are; decoding is idempotent.
    assert normalize_v3_uri("https://x/a%20b%25%3A") == "https://x/a%20b%25:"
    assert normalize_v3_uri("https://x/%253A") == "https://x/%253A"
    assert sign_v3("another-secret", "POST", DECODED_URI, b"", TS) == EXPECTED_DECODED
    assert sign_v3("another-secret", "POST", ENCODED_URI, b"", TS) == EXPECTED_DECODED
    verify_v3(["another-secret"], "POST", ENCODED_URI, b"", EXPECTED_DECODED, str(TS), TS)


def test_valid_request_verifies() -> None:
    _verify()
    _verify(now_ms=TS)
    _verify(now_ms=TS + 300_000)  # exactly 5 minutes old is still fine
    _verify(now_ms=TS - 300_000)  # and so is 5 minutes of clock skew the other way


def test_rotation_accepts_any_configured_secret() -> None:
    _verify(secrets=["new-secret", SECRET])
    _verify(secrets=[SECRET, "new-secret"])
    new_sig = sign_v3("new-secret", "POST", URI, BODY, TS)
    _verify(secrets=["new-secret", SECRET], signature=new_sig)
    assert _error(secrets=["new-secret"]).code == "bad_signature"


def test_no_secrets_is_a_configuration_error() -> None:
    with pytest.raises(ValueError):
        _verify(secrets=[])


@pytest.mark.parametrize("value", [None, "", "   "])
def test_missing_signature(value: str | None) -> None:
    assert _error(signature=value).code == "missing_signature"


@pytest.mark.parametrize("value", [None, "", " "])
def test_missing_timestamp(value: str | None) -> None:
    assert _error(timestamp=value).code == "missing_timestamp"


@pytest.mark.parametrize(
    "value", ["abc", "-1", "1.5e12", "1700000000000.0", " 1700000000000", "١٧٠٠", "9" * 40]
)
def test_bad_timestamp(value: str) -> None:
    assert _error(timestamp=value).code == "bad_timestamp"


@pytest.mark.parametrize("now_ms", [TS + 300_001, TS + 10**9, TS - 300_001, 0])
def test_stale_or_future_timestamp(now_ms: int) -> None:
    assert _error(now_ms=now_ms).code == "stale_timestamp"


def test_custom_max_age() -> None:
    _verify(now_ms=TS + 10_000, max_age_ms=10_000)
    assert _error(now_ms=TS + 10_001, max_age_ms=10_000).code == "stale_timestamp"


@pytest.mark.parametrize(
    "overrides",
    [
        {"signature": "not base64!"},
        {"signature": "ÿÿÿÿ"},
        {"signature": base64.b64encode(b"x" * 32).decode()},
        {"signature": EXPECTED[:-4]},
        {"body": BODY + b" "},
        {"method": "GET"},
        {"uri": URI + "&x=1"},
        {"uri": URI.replace("https", "http")},
        {"timestamp": str(TS + 1), "now_ms": TS},
        {"secrets": ["wrong"]},
    ],
)
def test_bad_signature(overrides: dict[str, object]) -> None:
    assert _error(**overrides).code == "bad_signature"


def test_messages_never_contain_secrets() -> None:
    secret = "super-secret-value-123"
    cases: list[dict[str, object]] = [
        {"signature": None},
        {"timestamp": None},
        {"timestamp": "x"},
        {"now_ms": 0},
        {"signature": "AAAA"},
    ]
    for overrides in cases:
        err = _error(secrets=[secret], **overrides)
        assert secret not in str(err)
        assert secret not in repr(err)


# --- fuzz -------------------------------------------------------------------------------

_header = st.none() | st.text(max_size=64)


@settings(max_examples=500, deadline=None)
@given(
    secrets=st.lists(st.text(max_size=40), min_size=1, max_size=3),
    method=st.text(max_size=8),
    uri=st.text(max_size=100),
    body=st.binary(max_size=512),
    signature=_header,
    timestamp=_header | st.integers(0, 2**64).map(str),
    now_ms=st.integers(0, 2**63),
)
def test_fuzz_only_signature_error(
    secrets: list[str],
    method: str,
    uri: str,
    body: bytes,
    signature: str | None,
    timestamp: str | None,
    now_ms: int,
) -> None:
    try:
        verify_v3(secrets, method, uri, body, signature, timestamp, now_ms)
    except SignatureError as exc:
        assert exc.http_status == 401
        assert exc.code in {
            "missing_signature",
            "missing_timestamp",
            "bad_timestamp",
            "stale_timestamp",
            "bad_signature",
        }


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(max_size=40),
    other=st.lists(st.text(max_size=40), max_size=2),
    method=st.sampled_from(["POST", "GET", "PUT"]),
    uri=st.text(max_size=100),
    body=st.binary(max_size=2048),
    timestamp_ms=st.integers(0, 10**15),
    drift=st.integers(-300_000, 300_000),
)
def test_fuzz_valid_signature_always_verifies(
    secret: str,
    other: list[str],
    method: str,
    uri: str,
    body: bytes,
    timestamp_ms: int,
    drift: int,
) -> None:
    signature = sign_v3(secret, method, uri, body, timestamp_ms)
    verify_v3(
        [*other, secret], method, uri, body, signature, str(timestamp_ms), timestamp_ms + drift
    )
