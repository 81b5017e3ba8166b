"""Where an ACK's milliseconds go: `connector` with timing spans around the receiver's steps.

    .venv/bin/python -m bench.webhook_spans OUT.json -- <connector arguments>

Started by ``bench/webhook.py --spans`` in place of ``python -m connector``. It wraps the
receiver module's steps (body read, signature check, JSON parse, the database insert) and
the whole handler with timers, samples the event loop's lag (how late a 10 ms timer fires:
CPU starvation, GIL waits, blocking calls) and garbage-collector pauses while the app serves,
runs the command, and on exit writes the percentiles of each, and what the collector still
tracks, to OUT.json. The wrappers cost about a microsecond a
call; the production code is unchanged.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import gc
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPANS: dict[str, list[float]] = defaultdict(list)
LAG_INTERVAL = 0.010


def _timed_sync(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPANS[name].append((time.perf_counter() - t) * 1000)

    return wrapper


def _timed_async(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            SPANS[name].append((time.perf_counter() - t) * 1000)

    return wrapper


async def _lag_sampler() -> None:
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(LAG_INTERVAL)
        SPANS["loop_lag"].append((loop.time() - t - LAG_INTERVAL) * 1000)


SERVING: list[bool] = []  # non-empty while the app runs (start-up collections are not counted)


def _gc_callback(phase: str, info: dict[str, Any]) -> None:
    if not SERVING:
        return
    if phase == "start":
        _gc_callback.started = time.perf_counter()  # type: ignore[attr-defined]
    else:
        started = getattr(_gc_callback, "started", None)
        if started is not None:
            SPANS[f"gc_gen{info.get('generation')}"].append((time.perf_counter() - started) * 1000)


def instrument() -> None:
    import connector.core.database as e
    import connector.intake.receivers as r

    # Whichever of these the version under test has (main's stored through a thread hop).
    for target, attr, name, wrap in (
        (r, "read_capped", "read_body", _timed_async),
        (r, "verify_v3", "verify_signature", _timed_sync),
        (r, "_parse", "parse_json", _timed_async),
        (r, "run_in_threadpool", "thread_hop_call", _timed_async),
        (r, "store_events_now", "db_insert", _timed_async),
        (r._App, "_in_db", "db_insert_via_thread", _timed_async),
        (r._App, "_answer", "handler_total", _timed_async),
        (getattr(e, "AsyncPool", None), "_acquire", "db_wait_for_slot", _timed_async),
        (getattr(e, "AsyncPool", None), "_run", "db_statement", _timed_async),
        (getattr(e, "AsyncPool", None), "_checkout", "db_checkout", _timed_async),
    ):
        if hasattr(target, attr):
            setattr(target, attr, wrap(name, getattr(target, attr)))
    original_lifespan = r._App.lifespan

    def lifespan(self: Any, app: Any) -> Any:
        sampler: list[asyncio.Task[None]] = []

        class _Ctx:
            async def __aenter__(self_inner) -> None:
                sampler.append(asyncio.get_running_loop().create_task(_lag_sampler()))
                SERVING.append(True)
                self_inner.inner = original_lifespan(self, app)
                await self_inner.inner.__aenter__()

            async def __aexit__(self_inner, *exc: Any) -> None:
                SERVING.clear()
                for task in sampler:
                    task.cancel()
                await self_inner.inner.__aexit__(*exc)

        return _Ctx()

    r._App.lifespan = lifespan  # type: ignore[method-assign, assignment]
    gc.callbacks.append(_gc_callback)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


def heap() -> dict[str, Any]:
    """What the collector still tracks at exit (after ``gc.freeze`` hid start-up's objects)."""
    from collections import Counter

    objs = gc.get_objects()
    kinds = Counter(type(o).__name__ for o in objs)
    return {"tracked": len(objs), "frozen": gc.get_freeze_count(), "top": kinds.most_common(8)}


def summary() -> dict[str, Any]:
    return {"heap": heap()} | {
        name: {
            "count": len(xs),
            "mean_ms": round(sum(xs) / len(xs), 3),
            "p50_ms": round(pct(xs, 50), 3),
            "p99_ms": round(pct(xs, 99), 3),
            "max_ms": round(max(xs), 3),
            "total_s": round(sum(xs) / 1000, 3),
        }
        for name, xs in sorted(SPANS.items())
        if xs
    }


def main() -> None:
    out = Path(sys.argv[1])
    assert sys.argv[2] == "--", "usage: python -m bench.webhook_spans OUT.json -- ARGS"
    instrument()
    atexit.register(lambda: out.write_text(json.dumps(summary(), indent=2) + "\n"))
    from connector.shell.cli import main as cli_main

    sys.exit(cli_main(sys.argv[3:]))


if __name__ == "__main__":
    main()
