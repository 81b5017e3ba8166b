"""Salesforce record ids: the 15-character and 18-character forms of one id, as pure functions.

A record id has 15 case-sensitive characters (what reports and the UI show); the APIs send
18, the same 15 plus a 3-character suffix that makes the id case-insensitive: for each
5-character chunk, bit i is set when character i is an upper-case letter, written as one
character of ``ABCDEFGHIJKLMNOPQRSTUVWXYZ012345``. A system on the way may case-fold an
18-character id; its suffix restores the case. Store one form everywhere: ``to_18``.
"""

from __future__ import annotations

import re

__all__ = ["SUFFIX_ALPHABET", "canonical_15", "id_key", "is_id", "same_id", "to_18"]

SUFFIX_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"

_ID_RE = re.compile(r"[A-Za-z0-9]{15}(?:[A-Za-z0-9]{3})?")


# Each character as one bit of its chunk: "1" for an upper-case letter, "0" for the rest.
_CASE_BITS = str.maketrans(
    {c: "1" if "A" <= c <= "Z" else "0" for c in map(chr, range(128)) if c.isalnum()}
)


def _suffix(id15: str) -> str:
    """The 3-character case suffix of a case-sensitive 15-character id (every character
    alphanumeric ASCII): chunk i's bits, character 0 the lowest, name one suffix character."""
    bits = id15.translate(_CASE_BITS)
    return (
        SUFFIX_ALPHABET[int(bits[4::-1], 2)]
        + SUFFIX_ALPHABET[int(bits[9:4:-1], 2)]
        + SUFFIX_ALPHABET[int(bits[14:9:-1], 2)]
    )


def _canonical_18(value: object) -> str | None:
    """The canonical 18-character form of a 15- or 18-character id, None if malformed; an
    18-character id already in it (what the APIs send) is returned as it is."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        return None
    if len(value) == 18 and _suffix(value[:15]) == value[15:]:
        return value
    id15 = value if len(value) == 15 else _case_from_suffix(value)
    return None if id15 is None else id15 + _suffix(id15)


def _case_from_suffix(value: str) -> str | None:
    """An 18-character id's first 15 characters in the case its suffix says; None when the
    suffix cannot belong to them."""
    chars = list(value[:15])
    for block, suffix_char in enumerate(value[15:].upper()):
        bits = SUFFIX_ALPHABET.find(suffix_char)
        if bits < 0:
            return None
        for offset in range(5):
            pos = block * 5 + offset
            upper = bool(bits >> offset & 1)
            if chars[pos].isalpha():
                chars[pos] = chars[pos].upper() if upper else chars[pos].lower()
            elif upper:
                return None
    return "".join(chars)


def canonical_15(value: str) -> str | None:
    """The case-sensitive 15-character form of a 15- or 18-character id; None if malformed.

    The case of an 18-character id's first 15 characters is ignored: its suffix decides it
    (so an id case-folded on the way still names its record). A suffix that cannot belong to
    those characters (it marks a digit upper case, or is no suffix character) gives None.
    """
    id18 = _canonical_18(value)
    return None if id18 is None else id18[:15]


def is_id(value: str) -> bool:
    """True for a well-formed 15- or 18-character id (an 18-character one in any case)."""
    return canonical_15(value) is not None


def to_18(value: str) -> str:
    """The canonical 18-character form of a 15- or 18-character id; ValueError if malformed."""
    id18 = _canonical_18(value)
    if id18 is None:
        raise ValueError("not a Salesforce id")
    return id18


def same_id(a: str, b: str) -> bool:
    """True when two ids (either form, surrounding blanks ignored) name the same record."""
    ca = canonical_15(a.strip())
    return ca is not None and ca == canonical_15(b.strip())


def id_key(value: str) -> str:
    """``to_18(value)`` for a well-formed id, the input unchanged otherwise (for comparing)."""
    id18 = _canonical_18(value)
    return value if id18 is None else id18
