"""The dispatcher's decisions as pure functions: no database, no CRM, no clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.writeback.outcomes import (
    NOT_FOUND,
    ORG_LIMIT_PAUSE_S,
    Claimed,
    Dead,
    Decision,
    Pause,
    Policy,
    Retry,
    Sent,
    Superseded,
    decide_guard,
    decide_outcomes,
    decide_request_failure,
    describe,
    finish_params,
    hold_tail,
    lease_valid,
    lease_wants_renewal,
    outcome_error,
    plan_round,
    retry_delay,
    superseded_reason,
    unexpected_error,
)
from crm_adapters.base import (
    AuthError,
    CrmError,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
    WriteOutcome,
)
from crm_adapters.salesforce_ids import to_18

POLICY = Policy(max_attempts=3, backoff_base=0.5, backoff_cap=60.0, auth_pause_seconds=45.0)


def top() -> float:
    """The jitter's largest draw: delays at their ceiling."""
    return 1.0


def row(i: int, attempts: int = 1, age: float = 1000.0, parent: str | None = None) -> Claimed:
    return Claimed(i, f"rec{i}", f"own{i}", parent, attempts, age)


def rows_of(*claimed: Claimed) -> dict[str, Claimed]:
    return {str(c.id): c for c in claimed}


def write_of(c: Claimed) -> OwnerWrite:
    return OwnerWrite(str(c.id), c.crm_id, c.owner_id, c.parent_id)


# -- plan_round --------------------------------------------------------------------------------


def test_plan_round_sorts_by_parent_and_keeps_a_partial_tail_of_a_small_claim() -> None:
    claimed = [row(1, parent="B"), row(2, parent="A"), row(3), row(4, parent="A")]
    plan = plan_round(claimed, max_batch=2, claim_limit=10, others_in_flight=False)
    assert [[w.key for w in b] for b in plan.batches] == [["2", "4"], ["1", "3"]]
    assert plan.released == [] and plan.kept == claimed
    odd = plan_round(claimed[:3], max_batch=2, claim_limit=10, others_in_flight=False)
    assert [len(b) for b in odd.batches] == [2, 1] and odd.released == []


def test_plan_round_gives_back_the_partial_tail_of_a_full_claim() -> None:
    claimed = [row(i, parent=f"P{i % 2}") for i in range(1, 6)]
    plan = plan_round(claimed, max_batch=2, claim_limit=5, others_in_flight=False)
    assert [len(b) for b in plan.batches] == [2, 2]
    assert plan.released == [5]  # the newest row, whatever its parent
    sent = {int(w.key) for b in plan.batches for w in b}
    assert sent == {c.id for c in plan.kept} == {1, 2, 3, 4}


def test_plan_round_keeps_a_full_tail_and_a_single_request() -> None:
    four = [row(i) for i in range(1, 5)]
    assert plan_round(four, max_batch=2, claim_limit=4, others_in_flight=True).released == []
    one_partial = [row(1), row(2)]
    plan = plan_round(one_partial, max_batch=5, claim_limit=2, others_in_flight=False)
    assert plan.released == [] and len(plan.batches) == 1


def test_plan_round_holds_the_partial_tail_while_another_claim_is_in_flight() -> None:
    """The claim that used to send 2 + 2 + 1 sends 2 + 2; the newest row waits for the
    merged tail that whoever claims alone will send."""
    claimed = [row(i, parent=p) for i, p in zip((7, 3, 9, 4, 5), "ZAZBA", strict=True)]
    plan = plan_round(claimed, max_batch=2, claim_limit=10, others_in_flight=True)
    assert plan.released == [9]
    assert [[w.key for w in b] for b in plan.batches] == [["3", "5"], ["4", "7"]]
    assert sorted(c.id for c in plan.kept) == [3, 4, 5, 7]
    alone = plan_round(claimed, max_batch=2, claim_limit=10, others_in_flight=False)
    assert alone.released == [] and [len(b) for b in alone.batches] == [2, 2, 1]


def test_plan_round_gives_back_a_claim_smaller_than_one_request_while_others_write() -> None:
    claimed = [row(1, parent="A"), row(2)]
    plan = plan_round(claimed, max_batch=5, claim_limit=10, others_in_flight=True)
    assert plan.kept == [] and plan.batches == [] and plan.released == [1, 2]


@pytest.mark.parametrize(
    ("claimed", "limit", "others", "hold"),
    [
        (1, 1000, False, False),  # a lone row under a trickle goes out at once
        (199, 1000, False, False),  # the backlog's tail, nobody else writing
        (450, 1000, False, False),  # every ready row, nobody else writing: one tail
        (1000, 1000, False, False),  # a full claim of full requests
        (999, 999, False, True),  # a full claim: more rows are probably waiting
        (150, 150, False, False),  # a full claim smaller than one request: nothing to add
        (1, 1000, True, True),  # someone else writes: wait for the merged tail
        (450, 1000, True, True),
        (400, 1000, True, False),  # only full requests: nothing to hold
        (0, 1000, True, False),
    ],
)
def test_hold_tail(claimed: int, limit: int, others: bool, hold: bool) -> None:
    assert hold_tail(claimed, 200, limit, others) is hold


@given(
    ids=st.sets(st.integers(1, 10_000), max_size=60),
    parents=st.lists(st.sampled_from(["A", "B", "C", None]), min_size=60, max_size=60),
    max_batch=st.integers(1, 12),
    claim_limit=st.integers(1, 80),
    others=st.booleans(),
)
def test_plan_round_sends_full_requests_or_the_whole_claim(
    ids: set[int], parents: list[str | None], max_batch: int, claim_limit: int, others: bool
) -> None:
    """Kept and given back partition the claim; what is given back is the newest rows and
    less than one request; a partial request goes out only when nothing is given back."""
    claimed = [row(i, parent=p) for i, p in zip(sorted(ids), parents, strict=False)]
    plan = plan_round(claimed, max_batch, claim_limit, others_in_flight=others)
    kept = sorted(c.id for c in plan.kept)
    assert sorted(kept + plan.released) == sorted(ids)
    assert sorted(int(w.key) for b in plan.batches for w in b) == kept
    assert len(plan.released) < max_batch
    assert not plan.released or not kept or max(kept) < min(plan.released)
    sizes = [len(b) for b in plan.batches]
    assert all(n == max_batch for n in sizes[:-1])
    if plan.released:
        assert all(n == max_batch for n in sizes)
    if others and len(claimed) % max_batch:
        assert plan.released


# -- lease_valid -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elapsed", "lease", "stale", "valid"),
    [(0.0, 60.0, 0, True), (59.9, 60.0, 0, True), (60.0, 60.0, 0, False), (1.0, 60.0, 1, False)],
)
def test_lease_valid(elapsed: float, lease: float, stale: int, valid: bool) -> None:
    assert lease_valid(elapsed, lease, stale) is valid


@pytest.mark.parametrize(
    ("elapsed", "lease", "renew"),
    [(0.0, 60.0, False), (14.9, 60.0, False), (15.0, 60.0, True), (59.0, 60.0, True)],
)
def test_lease_wants_renewal_once_a_quarter_has_gone(
    elapsed: float, lease: float, renew: bool
) -> None:
    assert lease_wants_renewal(elapsed, lease) is renew


# -- decide_guard ------------------------------------------------------------------------------


def test_decide_guard_sorts_each_write_by_the_owner_read_back() -> None:
    intake = frozenset({"queue"})
    unowned, queued, ours, person, gone = (row(i) for i in range(1, 6))
    rows = rows_of(unowned, queued, ours, person, gone)
    current = {"rec1": None, "rec2": "queue", "rec3": "own3", "rec4": "someone"}
    write, decided = decide_guard(
        [write_of(r) for r in (unowned, queued, ours, person, gone)],
        current,
        rows,
        "hubspot",
        intake,
    )
    assert [w.key for w in write] == ["1", "2"]
    assert decided == [Sent(3), Superseded(4, "someone"), Dead(5, NOT_FOUND)]


def test_decide_guard_compares_salesforce_ids_in_either_form() -> None:
    rid15, owner15 = "003000000000AbC", "005000000000XyZ"
    c = Claimed(7, rid15, owner15, None, 1)
    current = {to_18(rid15): to_18(owner15)}
    write, decided = decide_guard([write_of(c)], current, rows_of(c), "salesforce", frozenset())
    assert write == [] and decided == [Sent(7)]
    # in HubSpot ids are plain strings: a different spelling is another owner
    hs = decide_guard([write_of(c)], {rid15: owner15.lower()}, rows_of(c), "hubspot", frozenset())
    assert hs[1] == [Superseded(7, owner15.lower())]


def test_decide_guard_blank_owner_is_unowned() -> None:
    c = row(1)
    write, decided = decide_guard([write_of(c)], {"rec1": "  "}, rows_of(c), "hubspot", frozenset())
    assert [w.key for w in write] == ["1"] and decided == []


# -- retry_delay -------------------------------------------------------------------------------


def test_retry_delay_grows_with_attempts_up_to_the_cap() -> None:
    err = RetryableError("UNABLE_TO_LOCK_ROW")
    delays = [retry_delay(row(1, attempts=a), err, POLICY, top) for a in (1, 2, 3, 4, 20)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 60.0]
    assert retry_delay(row(1, attempts=0), err, POLICY, top) == 0.5


def test_retry_delay_without_retry_after_is_capped_by_the_rows_age() -> None:
    err = RetryableError("503")
    assert retry_delay(row(1, attempts=10, age=3.0), err, POLICY, top) == 3.0
    # but never below the base: a brand-new row still waits up to backoff_base
    assert retry_delay(row(1, attempts=10, age=0.01), err, POLICY, top) == 0.5


def test_retry_delay_honours_retry_after_beyond_age_and_cap() -> None:
    err = RateLimitedError("429", retry_after=120.0)
    assert retry_delay(row(1, attempts=1, age=0.1), err, POLICY, lambda: 0.0) == 120.0
    assert retry_delay(row(1, attempts=1, age=0.1), err, POLICY, top) == 120.5
    zero = RetryableError("503", retry_after=0.0)
    assert retry_delay(row(1, age=0.01), zero, POLICY, lambda: 0.0) == 0.0


def test_retry_delay_of_an_error_without_retry_after_attribute() -> None:
    assert retry_delay(row(1, attempts=2), AuthError("401"), POLICY, top) == 1.0


# -- per-record outcomes -----------------------------------------------------------------------


def test_outcome_error() -> None:
    assert outcome_error(WriteOutcome("k", True)) is None
    err = PermanentError("ENTITY_IS_DELETED")
    assert outcome_error(WriteOutcome("k", False, err)) is err
    unnamed = outcome_error(WriteOutcome("k", False))
    assert isinstance(unnamed, PermanentError) and unnamed.code == "UNKNOWN"


def test_decide_outcomes_covers_every_per_record_result() -> None:
    fresh, spent, bad, unnamed, limited = (row(1), row(2, attempts=3), row(3), row(4), row(5))
    ok = row(6)
    rows = rows_of(fresh, spent, bad, unnamed, limited, ok)
    lock = RetryableError("UNABLE_TO_LOCK_ROW", "locked")
    outcomes = [
        WriteOutcome("1", False, lock),
        WriteOutcome("2", False, lock),
        WriteOutcome("3", False, PermanentError("INACTIVE_OWNER_OR_USER", "inactive")),
        WriteOutcome("4", False),
        WriteOutcome("5", False, RateLimitedError("RATE_LIMITS", "slow down", 7.0)),
        WriteOutcome("6", True),
    ]
    assert decide_outcomes(outcomes, rows, POLICY, top) == [
        Retry(1, "UNABLE_TO_LOCK_ROW: locked", 0.5),
        Dead(2, "UNABLE_TO_LOCK_ROW: locked"),  # attempts spent
        Dead(3, "INACTIVE_OWNER_OR_USER: inactive"),
        Dead(4, "UNKNOWN: no error given"),
        Retry(5, "RATE_LIMITS: slow down", 7.5),
        Sent(6),
    ]


# -- whole-request failures --------------------------------------------------------------------


def _fail(exc: CrmError, *claimed: Claimed) -> tuple[list[Decision], Pause | None]:
    return decide_request_failure(
        exc, [write_of(c) for c in claimed], rows_of(*claimed), POLICY, lambda: 0.0
    )


def test_a_permanent_request_failure_kills_every_row_without_a_pause() -> None:
    decisions, pause = _fail(PermanentError("400", "bad request"), row(1), row(2, attempts=9))
    assert decisions == [Dead(1, "400: bad request"), Dead(2, "400: bad request")]
    assert pause is None


def test_a_crm_outage_retries_even_rows_past_their_attempts() -> None:
    decisions, pause = _fail(RetryableError("503", "down"), row(1, attempts=99))
    assert decisions == [Retry(1, "503: down", 0.0)] and pause is None


def test_a_request_rate_limit_retries_after_retry_after_without_a_pause() -> None:
    decisions, pause = _fail(RateLimitedError("429", "", 30.0), row(1, attempts=99))
    assert decisions == [Retry(1, "429", 30.0)] and pause is None


def test_an_org_rate_limit_pauses_the_org_for_its_retry_after() -> None:
    exc = RateLimitedError("REQUEST_LIMIT_EXCEEDED", "limit", 900.0, scope="org")
    decisions, pause = _fail(exc, row(1, attempts=99))
    assert pause == Pause(900.0, "REQUEST_LIMIT_EXCEEDED: limit")
    assert decisions == [Retry(1, "REQUEST_LIMIT_EXCEEDED: limit", 900.0)]
    _, default = _fail(RateLimitedError("DAILY", scope="org"), row(1))
    assert default == Pause(ORG_LIMIT_PAUSE_S, "DAILY")


def test_refused_credentials_pause_the_org_and_retry_every_row() -> None:
    decisions, pause = _fail(AuthError("INVALID_SESSION_ID"), row(1, attempts=99))
    assert pause == Pause(45.0, "INVALID_SESSION_ID")
    assert [type(d) for d in decisions] == [Retry]


def test_an_unclassified_failure_spends_the_attempt_budget() -> None:
    err = unexpected_error(RuntimeError("adapter bug"))
    assert (err.code, err.message) == ("UNEXPECTED", "RuntimeError")
    decisions, pause = _fail(err, row(1, attempts=2), row(2, attempts=3))
    assert decisions == [
        Retry(1, "UNEXPECTED: RuntimeError", 0.0),
        Dead(2, "UNEXPECTED: RuntimeError"),
    ]
    assert pause is None
    # a bare CrmError (no subclass says what to do) is treated the same way
    bare, _ = _fail(CrmError("ODD"), row(1, attempts=2), row(2, attempts=3))
    assert [type(d) for d in bare] == [Retry, Dead]


@given(
    attempts=st.integers(min_value=0, max_value=1000),
    age=st.floats(min_value=0, max_value=1e6),
    retry_after=st.none() | st.floats(min_value=0, max_value=1e5),
    kind=st.sampled_from(["503", "429", "auth", "org"]),
)
def test_crm_trouble_never_dead_letters(
    attempts: int, age: float, retry_after: float | None, kind: str
) -> None:
    exc: CrmError = {
        "503": RetryableError("503", retry_after=retry_after),
        "429": RateLimitedError("429", retry_after=retry_after),
        "auth": AuthError("401"),
        "org": RateLimitedError("DAILY", retry_after=retry_after, scope="org"),
    }[kind]
    c = row(1, attempts=attempts, age=age)
    decisions, _ = decide_request_failure(exc, [write_of(c)], rows_of(c), POLICY)
    (d,) = decisions
    assert isinstance(d, Retry) and d.delay >= 0
    if retry_after is not None and kind != "auth":
        assert d.delay >= retry_after
    else:
        assert d.delay <= max(age, POLICY.backoff_base)


# -- describe and finish_params ----------------------------------------------------------------


def test_describe_keeps_the_code_and_at_most_300_chars_of_message() -> None:
    assert describe(PermanentError("X")) == "X"
    assert describe(PermanentError("X", "m" * 400)) == "X: " + "m" * 300


def test_finish_params_maps_each_decision_to_its_columns() -> None:
    params = finish_params([Sent(1), Dead(2, "why"), Retry(3, "later", 2.5), Superseded(4, "p")])
    assert params == {
        "ids": [1, 2, 3, 4],
        "states": ["sent", "dead", "pending", "superseded"],
        "errors": [None, "why", "later", superseded_reason("p")],
        "delays": [0.0, 0.0, 2.5, 0.0],
        "owners": [None, None, None, "p"],
    }
    assert finish_params([]) == {"ids": [], "states": [], "errors": [], "delays": [], "owners": []}
