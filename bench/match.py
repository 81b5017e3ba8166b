"""Benchmark: lead-to-account matching, 10,000 leads against 100,000 accounts.

    .venv/bin/python -m bench.match [--quick]

One fresh database (the embedded PostgreSQL, or BENCH_DATABASE_URL), one team of 10 reps.
Measures, in the same run:

* the pure domain normalisation per lead (no database);
* loading the account mirror (100,000 accounts in pages of 200, as the poll stores them);
* routing the same 10,000 leads one per transaction (as a webhook does) and in batches of
  200 (as the poll does) under a ``route_to: account_owner`` rule, and, as the baseline, under
  a plain team rule in the same database: the difference is the matching's per-lead cost.

The leads: 60% at an account's domain (a few of them at a domain two owners share), 10% at
free-mail addresses, 30% at unknown domains. Prints a table and writes
bench/results/match.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from connector.core.config import OrgConfig
from connector.core.config_loading import parse_config
from connector.intake.accounts_sync import account_rows, store_accounts
from connector.routing.assign import Lead, Router
from connector.routing.domains import lead_domains
from connector.routing.teams import apply_teams
from connector.shell.store import make_engine
from crm_adapters.base import CrmAccount
from testbed.harness import ENV, team_yaml
from testbed.pg import DatabaseFactory, server_url

RESULTS = Path(__file__).parent / "results"
REPS = 10
PAGE = 200
BATCH = 200


def owner(i: int) -> str:
    return f"005{i % REPS:015d}"


def make_accounts(n: int, rng: random.Random) -> list[CrmAccount]:
    """Accounts at company{i}.com (messy websites); every 500th shares its domain with the
    next account, under another owner (ambiguous)."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    out: list[CrmAccount] = []
    for i in range(n):
        d = i - 1 if i % 500 == 1 else i  # account 500k+1 shares account 500k's domain
        website = rng.choice(
            [f"https://www.company{d}.com/", f"http://Company{d}.com", f"company{d}.com."]
        )
        domain_field = f"shop.company{d}.com" if i % 7 == 0 else None
        out.append(
            CrmAccount(
                f"001{i:015d}", owner(i), (website, domain_field), base + timedelta(seconds=i)
            )
        )
    return out


def make_leads(n: int, accounts: int, rng: random.Random, tag: str) -> list[Lead]:
    leads = []
    for i in range(n):
        r = rng.random()
        if r < 0.6:
            email = f"p{i}@Mail.Company{rng.randrange(accounts)}.com"
        elif r < 0.7:
            email = f"p{i}@{rng.choice(['gmail.com', 'yahoo.co.uk', 'outlook.com'])}"
        else:
            email = f"p{i}@unknown{i}.example.org"
        leads.append(Lead(f"00Q{tag}{i:013d}", {"Email": email, "Website": None}))
    return leads


def org_yaml(route_to: str) -> str:
    text_ = team_yaml(REPS, org=f"bench-{route_to.replace('_', '-')}")
    return text_.replace("  - {team: team}", f"  - {{team: team, route_to: {route_to}}}")


def load_mirror(engine: Engine, cfg: OrgConfig, accounts: list[CrmAccount]) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(accounts), PAGE):
        with engine.begin() as conn:
            store_accounts(conn, cfg.org, account_rows("salesforce", accounts[i : i + PAGE]))
    return time.perf_counter() - t0


def route(router: Router, leads: list[Lead], batch: int) -> dict[str, Any]:
    times: list[float] = []
    t0 = time.perf_counter()
    for i in range(0, len(leads), batch):
        s = time.perf_counter()
        router.assign_many(leads[i : i + batch], "api")
        times.append(time.perf_counter() - s)
    total = time.perf_counter() - t0
    times.sort()
    per_lead = [t / batch for t in times]
    return {
        "seconds": round(total, 3),
        "leads_per_s": round(len(leads) / total, 1),
        "ms_per_lead_mean": round(total / len(leads) * 1000, 3),
        "p50_ms_per_call": round(times[len(times) // 2] * 1000, 3),
        "p99_ms_per_call": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 3),
        "ms_per_lead_median": round(statistics.median(per_lead) * 1000, 3),
    }


def outcome_counts(engine: Engine, org: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT coalesce(a.account_match->>'result', 'rule') AS r, count(*) "
                "FROM assignments a WHERE a.org = :org GROUP BY 1"
            ),
            {"org": org},
        ).all()
    return {str(r[0]): int(r[1]) for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1,000 leads and 10,000 accounts")
    args = ap.parse_args()
    n_accounts = 10_000 if args.quick else 100_000
    n_leads = 1_000 if args.quick else 10_000
    rng = random.Random(62)
    url = os.environ.get("BENCH_DATABASE_URL") or server_url()
    factory = DatabaseFactory(url)
    t_start = time.time()
    rows: dict[str, Any] = {}
    try:
        engine = make_engine(factory.new(), pool_size=2)
        matching = parse_config(org_yaml("account_owner"), "bench.yaml", ENV)
        plain = parse_config(org_yaml("team"), "bench.yaml", ENV)
        for cfg in (matching, plain):
            apply_teams(engine, cfg)
        accounts = make_accounts(n_accounts, rng)

        sample = make_leads(n_leads, n_accounts, rng, "NN")
        lead_domains(sample[0].fields, matching.match_fields)  # parse the suffix list once
        t0 = time.perf_counter()
        for lead in sample:
            lead_domains(lead.fields, matching.match_fields)
        pure_us = (time.perf_counter() - t0) / n_leads * 1e6
        rows["normalise_us_per_lead"] = round(pure_us, 2)
        print(f"domain normalisation (pure): {pure_us:.1f} us per lead", flush=True)

        load_s = load_mirror(engine, matching, accounts)
        rows["mirror_load"] = {
            "accounts": n_accounts,
            "seconds": round(load_s, 2),
            "accounts_per_s": round(n_accounts / load_s, 1),
        }
        print(
            f"mirror load: {n_accounts:,} accounts in {load_s:.1f} s "
            f"({n_accounts / load_s:,.0f}/s, pages of {PAGE})",
            flush=True,
        )
        with engine.connect() as conn:
            conn.execute(text("ANALYZE crm_accounts"))
            conn.execute(text("ANALYZE crm_account_domains"))
            conn.commit()

        for label, cfg in (("account_owner", matching), ("team_rule", plain)):
            router = Router(engine, cfg)
            for batch in (1, BATCH):
                tag = f"{label[:1].upper()}{'S' if batch == 1 else 'B'}"
                leads = make_leads(n_leads, n_accounts, rng, tag)
                row = route(router, leads, batch)
                key = f"{label}_batch{batch}"
                rows[key] = row
                print(
                    f"{label:<14} batch={batch:<4} {n_leads:,} leads: "
                    f"{row['leads_per_s']:>8,.0f}/s  {row['ms_per_lead_mean']:.3f} ms/lead  "
                    f"p50 {row['p50_ms_per_call']:.2f} ms/call  "
                    f"p99 {row['p99_ms_per_call']:.2f} ms/call",
                    flush=True,
                )
        rows["outcomes_account_owner"] = outcome_counts(engine, matching.org)
        for batch in (1, BATCH):
            extra = (
                rows[f"account_owner_batch{batch}"]["ms_per_lead_mean"]
                - rows[f"team_rule_batch{batch}"]["ms_per_lead_mean"]
            )
            rows[f"matching_cost_ms_per_lead_batch{batch}"] = round(extra, 3)
            print(f"matching adds {extra:.3f} ms per lead at batch={batch}")
        print("outcomes:", rows["outcomes_account_owner"])
        engine.dispose()
    finally:
        factory.drop_all()
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "match",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "database": "BENCH_DATABASE_URL" if os.environ.get("BENCH_DATABASE_URL") else "embedded",
        "quick": args.quick,
        "accounts": n_accounts,
        "leads": n_leads,
        "results": rows,
        "seconds_total": round(time.time() - t_start, 1),
    }
    path = RESULTS / "match.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
