"""Prometheus metrics, in a registry of their own so that several apps can live in one process.

Counters and the latency histogram are updated by the code that does the work (webhooks now,
the outbox dispatcher later). Queue gauges (outbox depth, oldest pending age, webhook inbox)
are read from PostgreSQL at scrape time by a collector, so every process reports the shared
truth rather than its own view; the query is in ``db/metrics.sql``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, TextClause, text

import db
from connector.core import outage
from connector.core.errors import DatabaseError

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Webhook handling is one short transaction: 5 ms is a fast commit, 1 s is already a problem.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)

OUTBOX_STATES = ("pending", "claimed", "dead", "superseded")
SCRAPE_TIMEOUT_MS = 2000


def _queries() -> dict[str, TextClause]:
    return {k: text(v) for k, v in db.queries("metrics").items()}


class QueueCollector(Collector):
    """Outbox and inbox gauges per configured org, queried when Prometheus scrapes."""

    def __init__(self, engine: Engine, orgs: Iterable[str]) -> None:
        self.engine = engine
        self.orgs = sorted(orgs)
        self.sql = _queries()

    def describe(self) -> Iterable[Metric]:
        # Described without querying, so registering the collector never touches the DB.
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "connector_outbox_depth",
                "Outbox rows by state: not yet written (pending, claimed), dead, or superseded "
                "(a person's owner was found)",
                labels=["org", "state"],
            ),
            GaugeMetricFamily(
                "connector_outbox_oldest_pending_age_seconds",
                "Age of the oldest outbox row still pending or claimed",
                labels=["org"],
            ),
            GaugeMetricFamily(
                "connector_webhook_inbox_depth",
                "Pushed events waiting for their record to be read from the CRM and routed",
                labels=["org"],
            ),
            GaugeMetricFamily(
                "connector_webhook_inbox_oldest_age_seconds",
                "Age of the oldest webhook inbox event still waiting",
                labels=["org"],
            ),
            GaugeMetricFamily(
                "connector_database_up", "1 if the scrape-time queue query succeeded"
            ),
        )

    def collect(self) -> Iterator[Metric]:
        depth, oldest, inbox, inbox_age, up = self._families()
        try:
            with self.engine.begin() as conn:
                conn.execute(text(f"SET LOCAL statement_timeout = {SCRAPE_TIMEOUT_MS}"))
                outbox_rows = conn.execute(self.sql["outbox_gauges"]).all()
                inbox_rows = conn.execute(self.sql["inbox_gauges"]).all()
        except DatabaseError as exc:
            if not outage.counted("metrics queries", exc):
                log.warning("metrics: queue query failed: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        counts = {(r.org, r.state): r.n for r in outbox_rows}
        ages: dict[str, float] = {}
        for r in outbox_rows:
            if r.state in ("pending", "claimed"):
                ages[r.org] = max(ages.get(r.org, 0.0), float(r.oldest_age or 0.0))
        orgs = sorted({*self.orgs, *(r.org for r in outbox_rows), *(r.org for r in inbox_rows)})
        in_counts = {r.org: (r.n, float(r.oldest_age or 0.0)) for r in inbox_rows}
        for org in orgs:
            for state in OUTBOX_STATES:
                depth.add_metric([org, state], counts.get((org, state), 0))
            oldest.add_metric([org], ages.get(org, 0.0))
            n, age = in_counts.get(org, (0, 0.0))
            inbox.add_metric([org], n)
            inbox_age.add_metric([org], age)
        up.add_metric([], 1)
        yield from (depth, oldest, inbox, inbox_age, up)


class UnparsedCounter:
    """Counts one org's rule values that did not parse (``connector.routing.rules.Unparsed``)."""

    def __init__(self, counter: Counter, org: str) -> None:
        self.counter = counter
        self.org = org

    def add(self, key: tuple[str, str]) -> None:
        self.counter.labels(self.org, *key).inc()


class Metrics:
    """Every metric the connector exports, bound to one CollectorRegistry."""

    def __init__(self, engine: Engine | None = None, orgs: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.leads_ingested = Counter(
            "connector_leads_ingested",
            "Leads received, by ingest path and outcome (assigned, duplicate, unassigned)",
            ["source", "status"],
            registry=r,
        )
        self.assignments = Counter(
            "connector_assignments",
            "Leads assigned to a rep, by org and team",
            ["org", "team"],
            registry=r,
        )
        self.webhook_requests = Counter(
            "connector_webhook_requests",
            "Webhook requests answered, by endpoint and HTTP status code",
            ["endpoint", "code"],
            registry=r,
        )
        self.webhook_latency = Histogram(
            "connector_webhook_latency_seconds",
            "Time from request start to answer, by endpoint",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.webhook_events = Counter(
            "connector_webhook_events",
            "Pushed events, by outcome (queued, duplicate, ignored, foreign_portal)",
            ["org", "outcome"],
            registry=r,
        )
        self.records_skipped = Counter(
            "connector_records_skipped",
            "Records read back from the CRM and not routed, by reason (owned, not_found, "
            "wrong_object, invalid_record)",
            ["org", "reason"],
            registry=r,
        )
        self.outbox_superseded = Counter(
            "connector_outbox_superseded",
            "Owner writes dropped because the CRM showed a person's owner just before the write",
            ["org"],
            registry=r,
        )
        self.crm_calls = Counter(
            "connector_crm_calls",
            "Requests made to a CRM API, by org and operation",
            ["org", "operation"],
            registry=r,
        )
        self.crm_errors = Counter(
            "connector_crm_errors",
            "CRM errors, by org and the CRM's code (e.g. UNABLE_TO_LOCK_ROW, 429)",
            ["org", "code"],
            registry=r,
        )
        self.lock_retries = Counter(
            "connector_lock_retries",
            "Owner writes retried because the CRM could not lock the record or its parent",
            ["org"],
            registry=r,
        )
        self.crm_api_usage = Gauge(
            "connector_crm_api_usage",
            "The CRM's own quota figures as last reported (Salesforce Sforce-Limit-Info "
            "api-usage: used and total)",
            ["org", "figure"],
            registry=r,
        )
        self.rule_values_unparsed = Counter(
            "connector_rule_values_unparsed",
            "Lead field values a rule condition could not read as its type (number, date): "
            "that condition did not match; by org, field and type",
            ["org", "field", "type"],
            registry=r,
        )
        if engine is not None:
            r.register(QueueCollector(engine, orgs))

    def unparsed(self, org: str) -> UnparsedCounter:
        """What an org's router counts unparsed rule values in."""
        return UnparsedCounter(self.rule_values_unparsed, org)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
