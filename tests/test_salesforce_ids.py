"""crm_adapters.salesforce_ids against a reference written here from the published algorithm."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from crm_adapters.salesforce_ids import canonical_15, id_key, is_id, same_id, to_18

ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
ids_15 = st.text(alphabet=ALNUM, min_size=15, max_size=15)


def reference_suffix(id15: str) -> str:
    """For each 5-character chunk, bit i is set when character i is an upper-case A-Z."""
    table = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
    suffix = ""
    for chunk in (id15[0:5], id15[5:10], id15[10:15]):
        bits = sum(1 << i for i, c in enumerate(chunk) if c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
        suffix += table[bits]
    return suffix


def test_published_value() -> None:
    assert to_18("001A0000006Vm9r") == "001A0000006Vm9rIAC"
    assert reference_suffix("001A0000006Vm9r") == "IAC"
    assert canonical_15("001a0000006vm9riac") == "001A0000006Vm9r"


@given(ids_15)
def test_to_18_matches_the_reference(id15: str) -> None:
    assert to_18(id15) == id15 + reference_suffix(id15)
    assert canonical_15(id15) == id15
    assert is_id(id15)


@given(ids_15)
def test_to_18_is_idempotent(id15: str) -> None:
    id18 = to_18(id15)
    assert to_18(id18) == id18
    assert id_key(id18) == id_key(id15) == id18
    assert canonical_15(id18) == id15


@given(ids_15, st.sampled_from([str.upper, str.lower, str.swapcase]))
def test_case_folded_18_maps_back(id15: str, fold: Callable[[str], str]) -> None:
    folded = fold(to_18(id15))
    assert to_18(folded) == to_18(id15)
    assert canonical_15(folded) == id15
    assert same_id(folded, id15) and same_id(id15, folded)


@given(st.text(alphabet=ALNUM, min_size=18, max_size=18) | st.text(max_size=20))
def test_id_key_of_any_string_matches_the_reference(value: str) -> None:
    """Any 18 characters (a canonical id, a case-folded one, a suffix that cannot be one) and
    any other string: the canonical form of a well-formed id (its case taken from its
    suffix), the input itself otherwise."""
    expected = value
    if len(value) == 18 and all(c in ALNUM for c in value):
        # the first 15 characters in the case the suffix says, if the suffix can say it
        table = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
        chars, ok = list(value[:15]), True
        for block, s in enumerate(value[15:].upper()):
            bits = table.find(s)
            for i in range(5):
                c, upper = chars[block * 5 + i], bits >= 0 and bool(bits >> i & 1)
                if bits < 0 or (upper and not c.isalpha()):
                    ok = False
                elif c.isalpha():
                    chars[block * 5 + i] = c.upper() if upper else c.lower()
        if ok:
            expected = "".join(chars) + reference_suffix("".join(chars))
    elif len(value) == 15 and all(c in ALNUM for c in value):
        expected = value + reference_suffix(value)
    assert id_key(value) == expected


@pytest.mark.parametrize("value", [None, 12345, b"001A0000006Vm9rIAC"])
def test_id_key_of_what_is_not_a_str_is_the_value_itself(value: object) -> None:
    assert id_key(value) is value  # type: ignore[arg-type]
    assert canonical_15(value) is None  # type: ignore[arg-type]


@given(ids_15, ids_15)
def test_distinct_15_char_ids_stay_distinct(a: str, b: str) -> None:
    # 15-character ids are case-sensitive: they differ exactly when their 18 forms differ
    assert (to_18(a) == to_18(b)) is (a == b)
    assert same_id(a, b) is (a == b)


@given(st.text(max_size=20) | st.text(alphabet=ALNUM + " -!é", min_size=15, max_size=18))
def test_malformed_shape(value: str) -> None:
    assume(not (len(value) in (15, 18) and all(c in ALNUM for c in value)))
    assert canonical_15(value) is None
    assert not is_id(value)
    assert id_key(value) == value
    with pytest.raises(ValueError):
        to_18(value)


@given(ids_15, st.text(alphabet="6789", min_size=1, max_size=1), st.integers(0, 2))
def test_a_character_that_is_no_suffix_character_is_malformed(
    id15: str, bad: str, position: int
) -> None:
    suffix = list(reference_suffix(id15))
    suffix[position] = bad  # the suffix alphabet ends at 5
    value = id15 + "".join(suffix)
    assert canonical_15(value) is None and id_key(value) == value
    with pytest.raises(ValueError):
        to_18(value)


def test_a_suffix_that_marks_a_digit_upper_case_is_malformed() -> None:
    assert canonical_15("000000000000000BAA") is None
    assert not same_id("000000000000000BAA", "000000000000000BAA")
    assert canonical_15("") is None and canonical_15("00Q1") is None
    assert canonical_15("00Q5g00000LmAb!") is None


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("00D000000000062", "00D000000000062EAA", True),
        ("00D000000000062EAA", "00D000000000062", True),
        ("00D000000000062EAA", "00d000000000062eaa", True),  # 18-char ids ignore case
        ("00D000000000062", "00D000000000062", True),
        ("00D000000000062", "00d000000000062", False),  # 15-char ids are case-sensitive
        ("00D000000000062", "00D000000000063", False),
        ("00D000000000062EAA", "00D000000000063EAA", False),
        ("00D000000000062", "00D000000000062AAA", False),  # suffix says lowercase d
        ("00D000000000062", "00D00000000006", False),
        ("00D000000000062", "", False),
        ("", "", False),
        ("00D00000000006!", "00D00000000006!", False),
        ("00D000000000062EA9", "00D000000000062EA9", False),  # 9 is no suffix character
        ("000000000000000BAA", "000000000000000BAA", False),  # suffix marks a digit upper
    ],
)
def test_same_salesforce_id(a: str, b: str, same: bool) -> None:
    assert same_id(a, b) is same
