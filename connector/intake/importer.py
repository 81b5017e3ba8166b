"""File import: JSON lines or CSV with a header, one lead per line.

Parsing is pure and reports every bad row with its line number; good rows are still
ingested, in batches, through the same assignment code as every other input. A file is a hint
like any push: by default each batch of ids is read back from the CRM, and only the records the
CRM says are unrouted are routed, with the CRM's fields (see ``connector.intake.verify``); the
others are recorded as skipped with the reason. Without an adapter (``--no-verify``) the file's own
rows are routed as they are, for offline use. For a Salesforce org a row whose id is not a
15- or 18-character Salesforce id is rejected: it could never match a record the APIs send.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

from connector.core.crm_kinds import CrmKind, crm_kind
from connector.core.errors import UsageError
from connector.intake.inbox import read_unrouted, record_skips
from connector.intake.verify import Verdict
from connector.routing.assign import Lead, LeadError, Outcome, Router, validate_lead
from crm_adapters.base import CrmAdapter

Format = Literal["jsonl", "csv"]


@dataclass(frozen=True)
class Rejected:
    line: int
    reason: str


@dataclass
class Summary:
    new: int = 0
    assigned: int = 0
    unassigned: int = 0
    duplicate: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, verdict: Verdict) -> None:
        reason = verdict.reason or "unknown"
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add(self, outcome: Outcome) -> None:
        if outcome.status == "duplicate":
            self.duplicate += 1
            return
        self.new += 1
        if outcome.status == "assigned":
            self.assigned += 1
        else:
            self.unassigned += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "new": self.new,
            "assigned": self.assigned,
            "unassigned": self.unassigned,
            "duplicate": self.duplicate,
            "rejected": len(self.rejected),
            "skipped": sum(self.skipped.values()),
        }


def detect_format(path: Path) -> Format:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    raise UsageError(f"{path}: cannot tell the format from the name; pass --format jsonl|csv")


def parse_jsonl(
    lines: Iterable[str], id_field: str, ids: CrmKind | None = None
) -> Iterator[tuple[int, Lead | Rejected]]:
    """Yield (line number, lead or rejection) for each non-blank line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, Rejected(number, f"not valid JSON ({exc.msg})")
            continue
        if not isinstance(obj, dict):
            yield number, Rejected(number, "expected a JSON object")
            continue
        yield number, _to_lead(number, obj, id_field, ids)


def parse_csv(
    stream: TextIO, id_field: str, ids: CrmKind | None = None
) -> Iterator[tuple[int, Lead | Rejected]]:
    """Yield (line number, lead or rejection) for each data row; empty cells are missing."""
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        yield 1, Rejected(1, f"bad CSV header ({exc})")
        return
    header = [h.lstrip("\ufeff").strip() for h in header]
    if id_field not in header:
        yield 1, Rejected(1, f"header has no {id_field!r} column")
        return
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield line, Rejected(line, f"bad CSV row ({exc})")
            continue
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            yield line, Rejected(line, f"expected {len(header)} cells, found {len(row)}")
            continue
        obj = {k: (v if v.strip() else None) for k, v in zip(header, row, strict=True)}
        yield line, _to_lead(line, obj, id_field, ids)


def _to_lead(
    line: int, obj: Mapping[str, object], id_field: str, ids: CrmKind | None
) -> Lead | Rejected:
    try:
        lead = validate_lead(obj.get(id_field), obj)
    except LeadError as exc:
        reason = (
            f"{exc.reason} (column {id_field!r})" if exc.reason == "missing CRM id" else exc.reason
        )
        return Rejected(line, reason)
    if ids is not None and ids.typed_ids and not ids.is_id(lead.crm_id):
        return Rejected(line, f"not a {ids.label} id")
    if ids is not None and ids.id_key(lead.crm_id) != lead.crm_id:
        # one record, one id: a 15-character Salesforce id is stored in its 18 characters
        return Lead(ids.id_key(lead.crm_id), lead.fields)
    return lead


def read_file(
    path: Path, fmt: Format, id_field: str, ids: CrmKind | None = None
) -> Iterator[tuple[int, Lead | Rejected]]:
    raw = path.read_bytes()
    try:
        body = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if fmt == "jsonl":
        # not splitlines(): JSON strings may hold U+2028 or U+0085, which it splits on
        return parse_jsonl(io.StringIO(body, newline=None), id_field, ids)
    return parse_csv(io.StringIO(body, newline=""), id_field, ids)


class Progress:
    """A one-line progress bar on a terminal; silent when stderr is not a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.done = 0

    def advance(self, n: int) -> None:
        self.done += n
        if self.enabled:
            width = 30
            filled = int(width * self.done / self.total)
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")


def ingest_file(
    router: Router,
    path: Path,
    fmt: Format,
    id_field: str,
    batch_size: int = 500,
    adapter: CrmAdapter | None = None,
) -> Summary:
    """Ingest every good row of ``path``; rejections are collected with line numbers.

    With ``adapter`` each batch is verified against the CRM first (the default of
    `connector ingest`); without, the file's rows are routed as they are.
    """
    summary = Summary()
    # An org whose CRM has typed ids (Salesforce) rejects rows whose id is not one (line
    # numbers reported).
    rows = list(read_file(path, fmt, id_field, crm_kind(router.cfg.crm.kind)))
    progress = Progress(len(rows))
    batch: list[Lead] = []

    def flush() -> None:
        if adapter is None:
            for outcome in router.assign_many(batch, "import"):
                summary.add(outcome)
        else:
            _verified_flush(router, adapter, batch, summary)
        progress.advance(len(batch))
        batch.clear()

    for _, item in rows:
        if isinstance(item, Rejected):
            summary.rejected.append(item)
            progress.advance(1)
            continue
        batch.append(item)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    progress.close()
    return summary


def _verified_flush(
    router: Router, adapter: CrmAdapter, batch: list[Lead], summary: Summary
) -> None:
    """Read the batch's records from the CRM, route the unrouted ones with the CRM's fields,
    record the others as skipped: one CRM read (in the adapter's chunks), one transaction."""
    cfg = router.cfg
    routed, verdicts = read_unrouted(router.engine, cfg, adapter, [x.crm_id for x in batch])
    leads = [v.lead for v in verdicts if v.lead is not None]
    skips = [v for v in verdicts if v.reason is not None]
    with router.engine.begin() as conn:
        # the skips first, as the inbox does: the teams' locks that routing takes are held for
        # the routing and the commit only, and the two paths lock skips, then teams
        record_skips(conn, cfg, "import", skips)
        routed_now = router.assign_in_deferred(conn, leads, "import")
    outcomes = routed_now()  # after the commit, without the teams' locks
    for outcome in outcomes:
        summary.add(outcome)
    summary.duplicate += len({x.crm_id for x in batch} & routed)
    summary.duplicate += len(batch) - len({x.crm_id for x in batch})
    for v in skips:
        summary.skip(v)
