"""How list parameters travel to PostgreSQL: as binary arrays, flat lists of ints, strs and
instants (and lists of nothing but NULLs) packed in one pass.

Every connection an engine of ``database.create_engine`` opens sends a Python list as a binary
array (``send_lists_in_binary``). psycopg's own default is the text form, which it builds
element by element with a quoting check per element; its binary dumper still dumps element by
element in Python and scans the list first to size its ints. A batch of 500 leads sends about
a dozen arrays, one of them 5,000 ints: 0.69 ms through psycopg's binary dumper, about
0.1 ms here.

The element type follows the list's first element that is not None: a flat list whose first
such element is an ``int`` is sent as ``bigint[]``, a ``str`` as ``text[]``, a ``datetime``
with a time zone as ``timestamptz[]``; a list of nothing but None as a ``text[]`` of NULLs
(the statement's cast gives it its type, as it does for the others); any other list (empty,
led by a bool, a float, a date, a naive datetime, a nested list) goes through psycopg's own
binary dumper, which chooses by scanning. None elements are NULLs. An int out of the bigint
range, a datetime without a time zone in a ``timestamptz[]`` list, or an element of another
type, is refused with ``ArrayElementError`` before anything is sent: a ``ValueError``, not a
database error, since every list the connector sends is built by its own code (a bool after
an int is sent as 1 or 0, as ``struct`` takes it).

Every array parameter in db/*.sql is cast to its type (``CAST(:ids AS bigint[])``), since
the element type sent is the list's, not the column's: a new one must be too. Cast it where
it is evaluated once (``unnest``, an index condition, a ``MATERIALIZED`` CTE), never in an
expression computed per row: the cast is a real conversion (``bigint[]`` to ``integer[]``,
say), and once the statement runs on its generic plan it converts the whole array for every
row (``record_assignments`` went from 31 to 47 ms a batch of 500 that way).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, ClassVar

from psycopg.adapt import PyFormat
from psycopg.postgres import types as pg_types
from psycopg.types import TypeInfo
from psycopg.types.array import BaseListDumper, ListBinaryDumper

_INT8 = pg_types["int8"]
_TEXT = pg_types["text"]
_TIMESTAMPTZ = pg_types["timestamptz"]
_HEAD = struct.Struct("!iiiii")  # dimensions, has NULLs, element type, length, lower bound
_LEN = struct.Struct("!i").pack
_INT8_ITEM = struct.Struct("!iq")
_NULL = _LEN(-1)
_CHUNK = 256  # ints packed per struct call (a struct for every list length would be large)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # a binary timestamptz counts microseconds from it
_MICROSECOND = timedelta(microseconds=1)


class ArrayElementError(ValueError):
    """A list parameter holds an element its array type cannot carry (a bug in the caller:
    every list the connector sends is built by its own code)."""


@lru_cache(maxsize=_CHUNK)
def _ints(n: int) -> struct.Struct:
    """A struct of ``n`` (length, bigint) pairs."""
    return struct.Struct("!" + "iq" * n)


def pack_ints(values: Sequence[Any]) -> tuple[bytes, int]:
    """The elements of a ``bigint[]`` in binary (each one's length, then its value) and
    whether any is NULL."""
    n = len(values)
    args: list[Any] = [8] * (2 * n)
    args[1::2] = values
    whole = n - n % _CHUNK
    try:
        parts = [
            _ints(_CHUNK).pack(*args[2 * i : 2 * (i + _CHUNK)]) for i in range(0, whole, _CHUNK)
        ]
        if whole < n:
            parts.append(_ints(n - whole).pack(*args[2 * whole :]))
        return b"".join(parts), 0
    except struct.error:  # a NULL, or an element that is no bigint
        pass
    out: list[bytes] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(_NULL)
        else:
            try:
                out.append(_INT8_ITEM.pack(8, v))
            except struct.error:
                what = "out of its range" if isinstance(v, int) else f"a {type(v).__name__}"
                raise ArrayElementError(f"element {i} of a bigint[] list is {what}") from None
    return b"".join(out), int(None in values)


def pack_texts(values: Sequence[Any], encoding: str) -> tuple[bytes, int]:
    """The elements of a ``text[]`` in binary and whether any is NULL."""
    try:
        encoded = [v.encode(encoding) for v in values]
    except AttributeError:  # a NULL, or an element that is no str
        out: list[bytes] = []
        for i, v in enumerate(values):
            if v is None:
                out.append(_NULL)
            elif isinstance(v, str):
                e = v.encode(encoding)
                out += (_LEN(len(e)), e)
            else:
                raise ArrayElementError(
                    f"element {i} of a text[] list is a {type(v).__name__}"
                ) from None
        return b"".join(out), int(None in values)
    parts: list[Any] = [None] * (2 * len(encoded))
    parts[0::2] = map(_LEN, map(len, encoded))
    parts[1::2] = encoded
    return b"".join(parts), 0


def pack_instants(values: Sequence[Any]) -> tuple[bytes, int]:
    """The elements of a ``timestamptz[]`` in binary (microseconds since 2000-01-01 UTC) and
    whether any is NULL. A datetime without a time zone names no instant: refused."""
    micros: list[int | None] = []
    last: datetime | None = None  # the last instant converted (a batch's are mostly one)
    last_micros = 0
    for i, v in enumerate(values):
        if v is None:
            micros.append(None)
        elif last is not None and isinstance(v, datetime) and v.fold == last.fold and v == last:
            # The same instant again. Two datetimes of one tzinfo compare by their wall
            # clocks alone, so 01:30 before and after a clock goes back are equal: with the
            # same fold as well they are the same instant. (Of two tzinfos they compare as
            # instants, and a naive one is never equal to an aware one.)
            micros.append(last_micros)
        elif isinstance(v, datetime) and v.utcoffset() is not None:
            last, last_micros = v, (v - _PG_EPOCH) // _MICROSECOND
            micros.append(last_micros)
        else:
            what = "a datetime without a time zone" if isinstance(v, datetime) else None
            what = what or f"a {type(v).__name__}"
            raise ArrayElementError(f"element {i} of a timestamptz[] list is {what}")
    return pack_ints(micros)


class _PackedList(ListBinaryDumper):
    """A one-dimensional binary array of ``element``, whose elements ``pack`` packs."""

    element: ClassVar[TypeInfo]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.oid = cls.element.array_oid

    def pack(self, obj: list[Any]) -> tuple[bytes, int]:
        raise NotImplementedError

    def dump(self, obj: list[Any]) -> bytes:
        body, hasnull = self.pack(obj)
        return _HEAD.pack(1, hasnull, self.element.oid, len(obj), 1) + body


class _Int8List(_PackedList):
    element = _INT8

    def pack(self, obj: list[Any]) -> tuple[bytes, int]:
        return pack_ints(obj)


class _TextList(_PackedList):
    element = _TEXT

    def pack(self, obj: list[Any]) -> tuple[bytes, int]:
        # as psycopg's own str dumper: a SQL_ASCII database gets UTF-8
        encoding = self._tx.encoding
        return pack_texts(obj, encoding if encoding != "ascii" else "utf-8")


class _InstantList(_PackedList):
    element = _TIMESTAMPTZ

    def pack(self, obj: list[Any]) -> tuple[bytes, int]:
        return pack_instants(obj)


class _NullList(_PackedList):
    """A list of nothing but None: NULLs of type text, which the statement's cast converts."""

    element = _TEXT

    def pack(self, obj: list[Any]) -> tuple[bytes, int]:
        return _NULL * len(obj), 1


def _packer(obj: list[Any]) -> type[ListBinaryDumper] | None:
    for x in obj:
        if x is not None:
            first = type(x)
            if first is int:
                return _Int8List
            if first is str:
                return _TextList
            if first is datetime and x.utcoffset() is not None:
                return _InstantList
            return None
    return _NullList if obj else None


class ListDumper(ListBinaryDumper):
    """The dumper of every list parameter: ints, strs, instants and NULLs packed here, the
    rest by psycopg."""

    def get_key(self, obj: list[Any], format: PyFormat) -> Any:
        packer = _packer(obj)
        return (self.cls, packer) if packer else super().get_key(obj, format)

    def upgrade(self, obj: list[Any], format: PyFormat) -> BaseListDumper:
        packer = _packer(obj)
        return packer(self.cls, self._tx) if packer else super().upgrade(obj, format)


def send_lists_in_binary(dbapi_connection: Any, _record: Any) -> None:
    """The engine's ``connect`` hook: lists go out through ``ListDumper``."""
    dbapi_connection.adapters.register_dumper(list, ListDumper)
