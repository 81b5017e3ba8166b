"""The dashboard's lead->CRM latency: each outbox row carries its lead's received_at (0013),
and rows written before that (NULL there) give the same figures through the lead."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.routing.assign import Lead, Router
from connector.routing.reassign import reassign_lead
from connector.shell.dashboard import data

# where the latency test's timeline is moved: twenty minutes into an hour, so the leads and
# their sends (at most a few minutes apart on a loaded machine) fall in one hourly bucket
ARRIVED = datetime(2026, 12, 7, 13, 20, tzinfo=UTC)


def copies(engine: Engine) -> list[tuple[object, object]]:
    with engine.connect() as conn:
        return [
            (r.lead_received_at, r.received_at)
            for r in conn.execute(
                text(
                    "SELECT o.lead_received_at, l.received_at FROM outbox o "
                    "JOIN leads l ON l.id = o.lead_id ORDER BY o.id"
                )
            )
        ]


def test_outbox_rows_carry_the_leads_received_at(engine: Engine, applied: OrgConfig) -> None:
    leads = [Lead(f"00Q5g00000Late{i:02d}", {"Country": "US"}) for i in range(3)]
    Router(engine, applied).assign_many(leads, "api")
    Router(engine, applied).assign(Lead("00Q5g00000Late09", {"Country": "FR"}), "api")
    reassign_lead(engine, applied, leads[0].crm_id)  # a second outbox row for the same lead
    rows = copies(engine)
    assert len(rows) == 5
    assert all(copy is not None and copy == received for copy, received in rows)


def test_latency_is_the_same_with_and_without_the_copy(engine: Engine, applied: OrgConfig) -> None:
    Router(engine, applied).assign_many(
        [Lead(f"00Q5g00000Late{i:02d}", {"Country": "US"}) for i in range(9)], "api"
    )
    with engine.begin() as conn:
        # The leads' arrival (the server's now()) moved so the first is at ARRIVED, their
        # outbox rows' copies by the same amount: the gaps and the copies stay as written.
        shift = ARRIVED - conn.execute(text("SELECT min(received_at) FROM leads")).scalar_one()
        conn.execute(text("UPDATE leads SET received_at = received_at + :s"), {"s": shift})
        conn.execute(
            text("UPDATE outbox SET lead_received_at = lead_received_at + :s"), {"s": shift}
        )
        # sent 1, 2, ... 9 seconds after the lead arrived (ids in arrival order)
        conn.execute(
            text(
                "UPDATE outbox o SET state = 'sent', "
                "finished_at = l.received_at + make_interval(secs => "
                "(SELECT count(*) FROM leads x WHERE x.id <= l.id)) "
                "FROM leads l WHERE l.id = o.lead_id"
            )
        )
    now = ARRIVED + timedelta(minutes=30)  # after the last finished_at, in the same hour

    def latency() -> tuple[list[float], list[int]]:
        lat = data.overview(engine, applied, now).latency
        got = [(p50, p99, n) for p50, p99, n in zip(lat.p50, lat.p99, lat.counts, strict=True) if n]
        return [v for p50, p99, _ in got for v in (p50, p99) if v is not None], [n for *_, n in got]

    seconds = [float(s) for s in range(1, 10)]
    with_copy = latency()
    with engine.begin() as conn:  # rows written before migration 0013
        conn.execute(text("UPDATE outbox SET lead_received_at = NULL WHERE id % 2 = 0"))
    without = latency()
    assert with_copy == without
    assert with_copy[1] == [9]  # one hourly bucket
    p50, p99 = with_copy[0]
    assert p50 == statistics.median(seconds)
    assert p99 == statistics.quantiles(seconds, n=100, method="inclusive")[98]
    # a copy that disagrees with the lead would show: the copy is what is read
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE outbox SET lead_received_at = finished_at - interval '100 seconds'")
        )
    assert latency()[0] and min(latency()[0]) == 100.0
