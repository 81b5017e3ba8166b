"""Benchmark: rule matching, 10,000 leads against 500 rules and a 40,000-row territory table.

    .venv/bin/python -m bench.rules [--leads N] [--repeat N]

Pure Python, no database: what routing spends in ``rules.match`` before its one database
call. Measures, in one process:

* loading the config (YAML parse, condition parsing, the territory table built and checked);
* ``match`` per lead with the index (the router's path) and with a plain scan of the rules in
  order (each rule's ``matches``), on the same leads; both must agree on every lead;
* ``trace_rules`` per lead (what a decision records; the router traces each distinct set of
  rule-field values once per batch);
* the rules of the original form in the shipped example config (config/acme-salesforce.yaml)
  under ``match`` and under the original matcher (equality only, kept here as it was): the
  routing path's matching cost for a config of the original form, before and after.

The rules: 300 by country (a list of countries, a not-equals on industry, an employee range),
100 by title, email domain, creation date (relative), multi-value products or an `any` group,
99 more by country with an `all`/`not` group, then the territory rule and a default. The
leads draw each field at random, with unparseable numbers and dates among them. Prints a
table and writes bench/results/rules.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from connector.core.config import Rule
from connector.core.config_loading import load_configs, parse_config
from connector.core.rule_syntax import GROUPS
from connector.routing.decisions import trace_rules
from connector.routing.rules import compile_rules, match, org_rules

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
COUNTRIES = [f"C{i:02d}" for i in range(60)] + ["US", "DE"]
INDUSTRIES = ["Tech", "Retail", "Government", "Health", "Finance", "Education"]
TITLES = ["VP Sales", "Engineer", "CTO", "Head of Ops", "Intern", "Director"]
PRODUCTS = ["api", "sso", "billing", "audit", "mobile"]
TEAMS = [f"t{i}" for i in range(20)]


def territory_rows() -> list[dict[str, str]]:
    """40,000 rows: US 5-digit codes in ranges of 3 (30,000 rows), DE in ranges of 9."""
    rows = []
    for k in range(30_000):
        lo, hi = k * 3, k * 3 + 2
        rows.append({"country": "US", "postal_code": f"{lo:05d}-{hi:05d}", "team": TEAMS[k % 20]})
    for k in range(10_000):
        lo, hi = k * 9, k * 9 + 8
        rows.append({"country": "DE", "postal_code": f"{lo:05d}-{hi:05d}", "team": TEAMS[k % 7]})
    return rows


def rules(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(300):
        lo = rng.choice([0, 50, 200, 1000])
        out.append(
            {
                "team": TEAMS[i % 20],
                "when": {
                    "Country": rng.sample(COUNTRIES[:60], 2),
                    "Industry": {"not_equals": rng.choice(INDUSTRIES)},
                    "Employees": {"between": [lo, lo * 5 + 49]},
                },
            }
        )
    for i in range(100):
        kind = i % 5
        when: dict[str, Any]
        if kind == 0:
            when = {"Title": {"contains": rng.choice(["VP", "Chief", "Head"]) + str(i)}}
        elif kind == 1:
            when = {"Email": {"ends_with": f"@domain{i}.com"}}
        elif kind == 2:
            when = {"Created": {"gte": f"{i + 1} hours ago"}, "Employees": {"gte": 100_000}}
        elif kind == 3:
            when = {"Products": {"includes_all": [*rng.sample(PRODUCTS, 3), f"p{i}"]}}
        else:
            when = {
                "any": [
                    {"Title": {"starts_with": f"x{i}"}},
                    {"Email": {"starts_with": f"info{i}@"}},
                ]
            }
        out.append({"team": TEAMS[i % 20], "when": when})
    for i in range(99):
        out.append(
            {
                "team": TEAMS[i % 20],
                "when": {
                    "Country": [rng.choice(COUNTRIES[:60])],
                    "all": [
                        {"not": {"Industry": rng.sample(INDUSTRIES, 2)}},
                        {"Employees": {"gte": rng.choice([10, 500])}},
                    ],
                },
            }
        )
    out.append({"name": "by territory", "territory": "geo"})
    out.append({"name": "default", "team": "t0"})
    return out


def write_csv(path: Path) -> None:
    lines = ["country,state,postal_code,team"]
    lines += [f"{r['country']},,{r['postal_code']},{r['team']}" for r in territory_rows()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def config_yaml(rng: random.Random, inline: bool = True) -> str:
    doc = {
        "org": "bench",
        "crm": {
            "kind": "salesforce",
            "instance_url": "https://bench.my.salesforce.com",
            "auth": {"method": "session", "access_token": "${TOKEN}"},
        },
        "teams": [{"name": t, "members": [{"crm_user_id": f"u{t}", "name": t}]} for t in TEAMS],
        "territories": {
            "geo": {
                "fields": {"country": "Country", "postal_code": "PostalCode"},
                **({"rows": territory_rows()} if inline else {"file": "geo.csv"}),
            }
        },
        "rules": rules(rng),
    }
    return yaml.safe_dump(doc, sort_keys=False)


def leads(n: int, rng: random.Random) -> list[dict[str, object]]:
    out = []
    for i in range(n):
        created = NOW - timedelta(minutes=rng.randrange(0, 60 * 24 * 14))
        out.append(
            {
                "Country": rng.choice([*COUNTRIES, "us", " de "]),
                "Industry": rng.choice([*INDUSTRIES, None]),
                "Employees": rng.choice([rng.randrange(0, 20_000), str(rng.randrange(0, 6000))])
                if i % 20
                else "n/a",
                "Title": rng.choice(TITLES),
                "Email": f"p{i}@domain{rng.randrange(0, 400)}.com",
                "Created": created.isoformat() if i % 50 else "yesterday",
                "Products": ";".join(rng.sample(PRODUCTS, rng.randrange(0, 4))),
                "PostalCode": f"{rng.randrange(0, 100_000):05d}",
            }
        )
    return out


def per_lead_us(
    fn: Callable[[dict[str, object]], object], sample: list[dict[str, object]], repeat: int
) -> dict[str, float]:
    """CPU time (this process) and wall time per lead: on a shared machine the wall time
    also holds the time spent waiting for a core."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        for lead in sample:
            fn(lead)
        cpu.append((time.process_time() - c0) / len(sample) * 1e6)
        wall.append((time.perf_counter() - w0) / len(sample) * 1e6)
    return {
        "cpu_best_us": round(min(cpu), 2),
        "cpu_median_us": round(statistics.median(cpu), 2),
        "wall_median_us": round(statistics.median(wall), 2),
    }


def old_norm(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().casefold()


def old_compile(rs: list[Rule]) -> list[tuple[str | None, tuple[tuple[str, frozenset[str]], ...]]]:
    """The original matcher's compiled form: per rule, (field, allowed texts)."""
    return [
        (
            r.team,
            tuple(
                (k, frozenset(old_norm(v) for v in (vs if isinstance(vs, list) else [vs])))
                for k, vs in (r.when or {}).items()
            ),
        )
        for r in rs
    ]


def old_match(compiled: list[Any], fields: Mapping[str, object]) -> str | None:
    for team, conds in compiled:
        ok = True
        for name, allowed in conds:
            value = fields.get(name)
            if value is None or old_norm(value) not in allowed:
                ok = False
                break
        if ok:
            return team  # type: ignore[no-any-return]
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--leads", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_csv(folder / "geo.csv")
        (folder / "bench.yaml").write_text(config_yaml(random.Random(36), inline=False))
        t0 = time.perf_counter()
        cfg = load_configs(folder / "bench.yaml", {"TOKEN": "x"})["bench"]
        compiled = org_rules(cfg)
        load_s = time.perf_counter() - t0
    rng = random.Random(36)
    text = config_yaml(rng)
    t0 = time.perf_counter()
    inline_cfg = parse_config(text, "bench.yaml", {"TOKEN": "x"})
    inline_s = time.perf_counter() - t0
    assert len(inline_cfg.territories["geo"].table.rows) == 40_000
    sample = leads(args.leads, rng)
    n_rules = len(cfg.rules)
    n_rows = len(cfg.territories["geo"].table.rows)
    print(f"{n_rules} rules, {n_rows:,} territory rows, {len(sample):,} leads")
    print(f"config load, territory as CSV (parse, check, index): {load_s:.2f} s")
    print(f"config load, territory inline in the YAML: {inline_s:.2f} s")

    positions: Counter[str] = Counter()
    for lead in sample:
        m = match(compiled, lead, NOW)
        first = next((r.index for r in compiled if r.matches(lead, NOW)), None)
        assert (m.rule_index if m else None) == first, lead
        positions["territory" if m and m.rule_name == "by territory" else "default"
                  if m and m.rule_name == "default" else "other rules"] += 1  # fmt: skip

    indexed = per_lead_us(lambda lead: match(compiled, lead, NOW), sample, args.repeat)
    scan_sample = sample[: max(1, len(sample) // 10)]
    scan = per_lead_us(
        lambda lead: next((r for r in compiled if r.matches(lead, NOW)), None),
        scan_sample,
        max(1, args.repeat // 2),
    )
    trace = per_lead_us(lambda lead: trace_rules(compiled, lead, NOW), scan_sample, 1)

    example = ROOT / "config" / "acme-salesforce.yaml"
    ex_text = example.read_text(encoding="utf-8")
    ex_cfg = parse_config(ex_text, str(example), {k: "x" * 30 for k in _env_names(ex_text)})
    original = [  # its rules in the original form (as the example was before the operators)
        r
        for r in ex_cfg.rules
        if all(not isinstance(v, dict) and k not in GROUPS for k, v in (r.when or {}).items())
    ]
    ex_new = compile_rules(original)
    ex_old = old_compile(original)
    countries = ["US", "ca", " DE", None] * 2500
    ex_leads: list[dict[str, object]] = [{"Country": c, "Email": "a@b.com"} for c in countries]
    ex_after = per_lead_us(lambda lead: match(ex_new, lead), ex_leads, args.repeat)
    ex_before = per_lead_us(lambda lead: old_match(ex_old, lead), ex_leads, args.repeat)

    rows: dict[str, Any] = {
        "rules": n_rules,
        "territory_rows": n_rows,
        "leads": len(sample),
        "config_load_csv_s": round(load_s, 3),
        "config_load_inline_yaml_s": round(inline_s, 3),
        "matched_by": dict(positions),
        "match_indexed": indexed,
        "match_plain_scan": {**scan, "leads": len(scan_sample)},
        "trace_rules": {**trace, "leads": len(scan_sample)},
        "example_config_match_after": ex_after,
        "example_config_match_before": ex_before,
        "target_us": 50,
    }
    print(f"matched by: {dict(positions)}")
    print(f"{'':36}{'CPU best':>10}{'CPU med':>10}{'wall med':>10}  us per lead")
    for label, key in [
        ("match (index, the router's path)", "match_indexed"),
        ("match (plain scan of every rule)", "match_plain_scan"),
        ("trace_rules (what a decision holds)", "trace_rules"),
        ("example's original rules: now", "example_config_match_after"),
        ("example's original rules: before", "example_config_match_before"),
    ]:
        r = rows[key]
        print(
            f"{label:<36}{r['cpu_best_us']:>10.2f}{r['cpu_median_us']:>10.2f}"
            f"{r['wall_median_us']:>10.2f}"
        )
    met = indexed["cpu_median_us"] < 50
    print(f"target: under 50 us per lead (CPU, median) -> {'met' if met else 'NOT met'}")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "benchmark": "rules",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg": os.getloadavg(),
        },
        "results": rows,
    }
    path = RESULTS / "rules.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def _env_names(text: str) -> list[str]:
    return re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)


if __name__ == "__main__":
    main()
