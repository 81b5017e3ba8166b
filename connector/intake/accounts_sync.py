"""The account mirror: Accounts (Salesforce) / Companies (HubSpot) read from the CRM into
Postgres for lead-to-account matching, from a watermark (the CRM's last-modified time).

The poll runs it first, under the same per-org advisory lock, so the leads of that round
are matched against accounts at least as fresh as the round. The first refresh reads every
account; later ones re-read ``poll.overlap_seconds`` before the watermark (a row is replaced
only by one at least as new, so the repeats change nothing). Each page is stored and the
watermark advanced in one transaction; no transaction is open during a CRM call.

Not covered: an account deleted or merged in the CRM is not returned by these reads, so it
stays in the mirror (its owner keeps getting its domain's leads) until it is removed by hand:
``DELETE FROM crm_accounts WHERE org = ... AND crm_id = ...``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, TextClause, text

import db
from connector.core.config import OrgConfig
from connector.core.ownership import owner_key
from connector.routing.domains import account_domains
from crm_adapters.base import AccountSource, CrmAccount

log = logging.getLogger(__name__)

_SQL: dict[str, TextClause] = {k: text(v) for k, v in db.queries("accounts").items()}
# The first refresh reads every account there is.
BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class AccountSyncResult:
    pages: int = 0
    seen: int = 0
    stored: int = 0
    domains: int = 0
    watermark: datetime | None = None


@dataclass(frozen=True)
class AccountRows:
    """A page of accounts in the form they are stored and compared in (pure)."""

    crm_ids: list[str]
    owner_ids: list[str | None]
    modified: list[datetime]
    domains: dict[str, list[str]]


def account_rows(kind: str, page: Sequence[CrmAccount]) -> AccountRows:
    """Canonical ids and owners (Salesforce: 18 characters) and matchable domains; the last
    copy of an account wins when a page repeats one."""
    latest: dict[str, CrmAccount] = {}
    for a in page:
        key = owner_key(kind, a.crm_id)
        if key not in latest or latest[key].modified_at <= a.modified_at:
            latest[key] = a
    ids = sorted(latest)
    owners: list[str | None] = []
    for i in ids:
        owner = latest[i].owner_id
        owners.append(owner_key(kind, owner) if owner and owner.strip() else None)
    return AccountRows(
        crm_ids=ids,
        owner_ids=owners,
        modified=[latest[i].modified_at for i in ids],
        domains={i: account_domains(latest[i].domain_values) for i in ids},
    )


def store_accounts(conn: Connection, org: str, rows: AccountRows) -> tuple[int, int]:
    """Upsert one page in the caller's transaction: (accounts written, domains written)."""
    if not rows.crm_ids:
        return 0, 0
    written = list(
        conn.execute(
            _SQL["upsert_accounts"],
            {
                "org": org,
                "crm_ids": rows.crm_ids,
                "owner_ids": rows.owner_ids,
                "modified": rows.modified,
            },
        ).scalars()
    )
    if not written:
        return 0, 0
    conn.execute(_SQL["clear_domains"], {"org": org, "crm_ids": written})
    pairs = [(d, cid) for cid in written for d in rows.domains.get(cid, [])]
    if pairs:
        conn.execute(
            _SQL["insert_domains"],
            {"org": org, "domains": [p[0] for p in pairs], "crm_ids": [p[1] for p in pairs]},
        )
    return len(written), len(pairs)


def refresh_window(watermark: datetime | None, overlap_s: int) -> datetime:
    """Where this refresh starts reading (pure): everything the first time."""
    return BEGINNING if watermark is None else watermark - timedelta(seconds=overlap_s)


def refresh_accounts(
    engine: Engine,
    cfg: OrgConfig,
    source: AccountSource,
    page_size: int = 200,
) -> AccountSyncResult:
    """Read the accounts changed since the watermark and store them, page by page."""
    org = cfg.org
    with engine.connect() as conn:
        watermark = conn.execute(_SQL["watermark"], {"org": org}).scalar_one_or_none()
    since = refresh_window(watermark, cfg.poll.overlap_seconds)
    result = AccountSyncResult(watermark=watermark)
    for page in source.accounts_changed_since(since, page_size=page_size):
        if not page:
            continue
        rows = account_rows(cfg.crm.kind, page)
        page_max = max(a.modified_at for a in page)
        with engine.begin() as conn:
            stored, domains = store_accounts(conn, org, rows)
            conn.execute(_SQL["advance"], {"org": org, "watermark": page_max})
        result.pages += 1
        result.seen += len(page)
        result.stored += stored
        result.domains += domains
        result.watermark = max(result.watermark or page_max, page_max)
    log.info(
        "org %s: account refresh read %d accounts in %d pages, stored %d (%d domains)",
        org,
        result.seen,
        result.pages,
        result.stored,
        result.domains,
    )
    return result
