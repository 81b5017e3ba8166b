"""Where a webhook body is parsed: small ones on the event loop, large ones in a process of
their own.

A body parse is CPU work in C (expat, the JSON decoder) that holds the GIL. Parsed in a
thread of the receiver's process, a costly body under every cap (49,000 XML elements, a
valid URL secret) held the event loop off long enough that every other sender's ACK took
28 times as long at the median (``python -m bench.hostile``). In a separate process it holds
its own GIL instead: one worker process per receiver, created on first use (``spawn``: the
receiver has threads, which ``fork`` would copy mid-lock), parses the large bodies one after
another, so a sender of heavy bodies queues behind its own, and the small bodies of everyone
else are parsed at once on the loop.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

T = TypeVar("T")

INLINE_PARSE_BYTES = 32_768
"""Bodies up to this size are parsed on the event loop (a one-event HubSpot body parses in
about 10 us; a hop to the parser process costs far more); larger ones in the parser
process."""

PARSER_NICENESS = 19
"""The parser process runs at the lowest CPU priority: when the cores are busy, answering the
small deliveries (and the database) goes first, and a flood of large bodies waits."""

_pool: ProcessPoolExecutor | None = None
_lock = threading.Lock()


class ParserUnavailable(Exception):
    """The parser process died (killed, out of memory); the next body starts a new one."""


def _parser_pool() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=os.nice,
                initargs=(PARSER_NICENESS,),
            )
        return _pool


def close_parsers() -> None:
    """Stop the parser process (the receiver's shutdown); a later large body starts one."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


async def parse_body(parse: Callable[[bytes, int], T], body: bytes, limit: int) -> T:
    """``parse(body, limit)``: inline for a small body, in the parser process for a large one
    (its exceptions come back as raised there; ``parse`` must be a module-level function)."""
    if len(body) <= INLINE_PARSE_BYTES:
        return parse(body, limit)
    pool = _parser_pool()
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, parse, body, limit)
    except BrokenProcessPool:
        global _pool
        with _lock:
            if _pool is pool:
                _pool = None
        raise ParserUnavailable("the parser process stopped") from None
