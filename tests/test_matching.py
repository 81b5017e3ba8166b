"""Lead-to-account matching, pure parts: domain normalisation, free mail, the decision."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from connector.intake.accounts_sync import BEGINNING, account_rows, refresh_window
from connector.routing.accounts import Seat, seat_for
from connector.routing.domains import (
    AccountDecision,
    AccountRow,
    Rep,
    account_domains,
    decide,
    is_free_mail,
    lead_domains,
    matchable_domain,
    registrable_domain,
)
from crm_adapters.base import CrmAccount


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("https://WWW.Example.co.uk/path", "example.co.uk"),
        ("http://www.example.com:8080/a/b?c=d#e", "example.com"),
        ("example.com", "example.com"),
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("www.example.com./", "example.com"),
        ("mail.example.com", "example.com"),
        ("a.b.c.example.com", "example.com"),
        ("user@sub.example.com", "example.com"),
        ("First.Last+tag@Mail.Example.CO.UK", "example.co.uk"),
        ("  jane@example.com  ", "example.com"),
        ("https://user:pw@www.example.com/", "example.com"),
        ("//cdn.example.org/x", "example.org"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("https://www.bücher.de/", "xn--bcher-kva.de"),
        ("info@BÜCHER.de", "xn--bcher-kva.de"),
        ("пример.рф", "xn--e1afmkfd.xn--p1ai"),
        ("shop.xn--e1afmkfd.xn--p1ai", "xn--e1afmkfd.xn--p1ai"),
        ("foo.github.io", "foo.github.io"),  # a private suffix: each site its own domain
        ("www.example.com.au", "example.com.au"),
        ("example.local", "example.local"),  # unknown top-level: its last label is the suffix
    ],
)
def test_registrable_domain_of_messy_values(value: str, expected: str) -> None:
    assert registrable_domain(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        None,
        42,
        "co.uk",  # a bare public suffix
        "com",
        "github.io",
        "localhost",
        "192.168.1.10",
        "http://10.0.0.1:8080/x",
        "user@[127.0.0.1]",
        "[::1]",
        "2001:db8::1",
        "1.2.3",
        "not a domain",
        "exa_mple.com",
        "-bad-.com",
        "a..b.com",
        "@",
        "mailto:",
        "https://",
        "x" * 64 + ".com",
        "a." * 200 + "com",
        "xn--.com",
    ],
)
def test_registrable_domain_refuses_garbage(value: object) -> None:
    assert registrable_domain(value) is None


@pytest.mark.parametrize(
    "domain",
    ["gmail.com", "googlemail.com", "outlook.com", "hotmail.co.uk", "yahoo.com", "yahoo.co.jp",
     "yahoo.fr", "icloud.com", "proton.me", "gmx.de", "live.com", "web.de"],
)  # fmt: skip
def test_free_mail_domains_are_known(domain: str) -> None:
    assert is_free_mail(domain)


def test_free_mail_never_matches_but_company_domains_do() -> None:
    assert matchable_domain("jane@gmail.com") is None
    assert matchable_domain("jane@mail.yahoo.co.uk") is None
    assert matchable_domain("https://www.outlook.com") is None
    assert matchable_domain("jane@yahooligans-corp.com") == "yahooligans-corp.com"
    assert matchable_domain("jane@livestream.com") == "livestream.com"
    assert not is_free_mail("example.com")


def test_lead_domains_keep_field_order_and_drop_free_mail_and_repeats() -> None:
    fields = {"Email": "ceo@gmail.com", "Website": "https://www.acme.io", "Other": "x@acme.io"}
    assert lead_domains(fields, ["Email", "Website", "Other"]) == [("Website", "acme.io")]
    fields = {"Email": "a@sub.acme.io", "Website": "globex.com"}
    both = [("Email", "acme.io"), ("Website", "globex.com")]
    assert lead_domains(fields, ["Email", "Website"]) == both
    assert lead_domains({}, ["Email"]) == []


def test_account_domains_split_lists_and_skip_free_mail() -> None:
    assert account_domains(["https://www.acme.io", "acme.io; acme.co.uk, gmail.com", None]) == [
        "acme.io",
        "acme.co.uk",
    ]
    assert account_domains([None, "", "garbage value"]) == []


T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ACME = AccountRow("001A", "005OWNER1", T0)
ACME_OLD = AccountRow("001B", "005OWNER1", T0 - timedelta(days=3))
RIVAL = AccountRow("001C", "005OWNER2", T0 - timedelta(days=1))
NOBODY = AccountRow("001D", None, T0)
REPS = {"005OWNER1": Rep(True), "005OWNER2": Rep(True), "005GONE": Rep(False)}


def test_parent_account_decides_first() -> None:
    d = decide("001A", [("Email", "rival.com")], {"001A": ACME}, {"rival.com": [RIVAL]}, REPS)
    assert d == AccountDecision("matched", "parent", "001A", "005OWNER1")
    assert d.as_json() == {
        "result": "matched",
        "by": "parent",
        "account_id": "001A",
        "owner_id": "005OWNER1",
    }


def test_unknown_parent_falls_through_to_domains() -> None:
    d = decide("001Z", [("Email", "acme.io")], {}, {"acme.io": [ACME]}, REPS)
    assert (d.result, d.by, d.account_id, d.field, d.domain) == (
        "matched",
        "domain",
        "001A",
        "Email",
        "acme.io",
    )


def test_first_field_with_an_account_decides() -> None:
    by_domain = {"acme.io": [ACME], "rival.com": [RIVAL]}
    d = decide(None, [("Email", "nobody.org"), ("Website", "rival.com")], {}, by_domain, REPS)
    assert (d.account_id, d.field) == ("001C", "Website")


def test_same_owner_on_several_accounts_is_not_ambiguous_and_records_the_newest() -> None:
    d = decide(None, [("Email", "acme.io")], {}, {"acme.io": [ACME_OLD, ACME]}, REPS)
    assert (d.result, d.account_id) == ("matched", "001A")


def test_different_owners_on_one_domain_fall_back_as_ambiguous() -> None:
    d = decide(None, [("Email", "acme.io")], {}, {"acme.io": [RIVAL, ACME]}, REPS)
    assert d.result == "ambiguous" and not d.matched
    assert d.candidates == ("001A", "001C")  # newest first
    assert d.as_json() == {
        "result": "ambiguous",
        "by": "domain",
        "field": "Email",
        "domain": "acme.io",
        "candidates": ["001A", "001C"],
    }


@pytest.mark.parametrize(
    ("owner", "result"),
    [("005GONE", "owner_inactive"), ("005STRANGER", "owner_not_a_rep"), (None, "no_owner")],
)
def test_ineligible_owners_fall_back(owner: str | None, result: str) -> None:
    acct = AccountRow("001X", owner, T0)
    d = decide("001X", [], {"001X": acct}, {}, REPS)
    assert d.result == result and not d.matched
    assert d.account_id == "001X"


def test_no_account_at_all() -> None:
    assert decide(None, [("Email", "acme.io")], {}, {}, REPS) == AccountDecision("no_account")
    assert decide(None, [], {}, {}, REPS).as_json() == {"result": "no_account"}


def _seat(member_id: int, team: str, active: bool = True) -> Seat:
    return Seat(member_id, "005OWNER1", "Owner", active, member_id * 10, team, 1)


def test_seat_prefers_the_rules_team_then_the_first_active_one() -> None:
    seats = [_seat(1, "emea"), _seat(2, "na", active=True), _seat(3, "zz")]
    assert seat_for(seats, "na") == seats[1]
    assert seat_for(seats, "apac") == seats[0]
    assert seat_for([_seat(1, "emea", active=False), _seat(3, "zz")], "emea") == _seat(3, "zz")
    assert seat_for([_seat(1, "emea", active=False)], "emea") is None


def test_account_rows_canonical_ids_domains_and_last_copy_wins() -> None:
    page = [
        CrmAccount("001000000000001", "005000000000001", ("https://www.acme.io", None), T0),
        CrmAccount("001000000000001AAA", "005000000000002", ("acme.io", "acme.de"), T0),
        CrmAccount("001000000000002AAA", " ", ("gmail.com",), T0),
    ]
    rows = account_rows("salesforce", page)
    assert rows.crm_ids == ["001000000000001AAA", "001000000000002AAA"]
    assert rows.owner_ids == ["005000000000002AAA", None]
    assert rows.domains == {"001000000000001AAA": ["acme.io", "acme.de"], "001000000000002AAA": []}


def test_refresh_window_reads_everything_first() -> None:
    assert refresh_window(None, 120) == BEGINNING
    assert refresh_window(T0, 120) == T0 - timedelta(seconds=120)
