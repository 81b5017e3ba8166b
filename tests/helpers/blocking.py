"""Work that blocks on the server: started in a thread, and seen waiting for a lock."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import Engine, text


def wait_until_blocked(engine: Engine, like: str = "%", sessions: int = 1) -> None:
    """Until ``sessions`` sessions of this database whose query is LIKE ``like`` wait for a
    lock (on a shared server other tests' sessions wait for locks too)."""
    with engine.connect() as watch:
        for _ in range(200):
            waiting = watch.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND query LIKE :q"
                ),
                {"q": like},
            ).scalar_one()
            watch.rollback()  # pg_stat_activity is read once per transaction
            if waiting >= sessions:
                return
            threading.Event().wait(0.05)
    raise AssertionError(f"fewer than {sessions} sessions LIKE {like!r} waited for a lock")


def in_thread(fn: Callable[[], object], errors: list[BaseException]) -> threading.Thread:
    """``fn`` started in a thread; whatever it raises goes to ``errors``."""

    def guarded() -> None:
        try:
            fn()
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    t = threading.Thread(target=guarded)
    t.start()
    return t
