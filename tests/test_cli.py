"""The `connector` command line, in-process on a fresh database, and as real subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

import db
from connector.shell.cli import main
from testbed.processes import Forked, finish

CONFIG = """
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {method: session, access_token: "${ACME_TOKEN}"}
  object: Lead
  organization_id: 00D5g000004ABCDEA4
  outbound_secrets: ["${ACME_OM}"]
intake_owner_ids: ["00G000000000001"]
teams:
  - name: na_ae
    members:
      - {crm_user_id: "005A", name: Ada, weight: 1}
      - {crm_user_id: "005B", name: Alan, weight: 2}
  - name: row_ae
    members:
      - {crm_user_id: "005C", name: Grace}
      - {crm_user_id: "005D", name: Edsger, active: false}
rules:
  - {team: na_ae, when: {Country: [US, CA]}}
  - {team: row_ae, when: {Country: [DE, FR, UK]}}
"""
TOKEN = "tok-never-printed"
OFFLINE = " (not verified against the CRM: --no-verify)"
OM = "om-url-secret-0123456789abcdef"


@pytest.fixture
def cfg_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config file that CONNECTOR_CONFIG names; the database URL leads nowhere."""
    cfg = tmp_path / "acme.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    monkeypatch.setenv("ACME_TOKEN", TOKEN)
    monkeypatch.setenv("ACME_OM", "om-url-secret-0123456789abcdef")
    monkeypatch.setenv("CONNECTOR_CONFIG", str(cfg))
    monkeypatch.delenv("CONNECTOR_AUTO_MIGRATE", raising=False)
    return cfg


@pytest.fixture
def cli_env(cfg_file: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The same, with DATABASE_URL at a fresh test database."""
    monkeypatch.setenv("DATABASE_URL", db_url)
    return cfg_file


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    return code, out, err


def table_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("leads", "assignments", "outbox")
        }


def test_check_config_ok(cfg_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check-config")
    assert (code, err) == (0, "")
    assert out == (
        "org acme: salesforce Lead, 2 teams, 4 members (3 active), 2 rules "
        "(no default rule: unmatched leads stay unassigned)\n"
    )


def test_check_config_error_names_file_and_key(
    cfg_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.replace("weight: 2}", "weigth: 2}"), encoding="utf-8")
    code, out, err = run(capsys, "--config", str(bad), "check-config")
    assert (code, out) == (2, "")
    assert err == f"{bad}:15: teams[0].members[1].weigth: unknown key; did you mean `weight`?\n"


def test_check_config_missing_env_var(
    cfg_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACME_TOKEN")
    code, out, err = run(capsys, "check-config")
    assert (code, out) == (2, "")
    assert err == (
        f"{cfg_file}:6: crm.auth.access_token: "
        "environment variable ACME_TOKEN is not set; set it where the connector runs\n"
    )


def test_no_config_at_all(
    cfg_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONNECTOR_CONFIG")
    code, _, err = run(capsys, "check-config")
    assert code == 2
    assert err == (
        "connector: no configuration: pass --config FILE_OR_FOLDER or set CONNECTOR_CONFIG\n"
    )


def test_migrate(cli_env: Path, engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "migrate")
    assert (code, err) == (0, "")
    # the test database is already migrated; new teams start in their first epoch
    assert out == "migrations applied: none (up to date)\norg acme: 2 teams applied\n"
    code, out, _ = run(capsys, "migrate")
    assert out.splitlines()[1] == "org acme: 2 teams applied"
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name FROM teams ORDER BY name")).all()
    assert [r[0] for r in rows] == ["na_ae", "row_ae"]


def _write_jsonl(path: Path) -> Path:
    path.write_text(
        "\n".join(
            [
                '{"Id": "00Q000000000001", "Country": "US"}',  # 1
                '{"Id": "00Q000000000002", "Country": "de"}',  # 2
                "{oops",  # 3
                "",  # 4
                '{"Country": "US"}',  # 5
                '{"Id": "00Q000000000003", "Country": "JP"}',  # 6: no rule
                "[1]",  # 7
                '{"Id": "00Q000000000004", "Country": "CA"}',  # 8
                '{"Id": "00q000000000001eaa", "Country": "US"}',  # 9: line 1 by its 18-char id
                '{"Id": "00Q1", "Country": "US"}',  # 10: not a Salesforce id
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    return path


def _write_csv(path: Path) -> Path:
    path.write_text(
        "Id,Country,Note\n"  # 1
        '00Q000000000010,US,"two\nlines"\n'  # 2-3
        "00Q000000000011,FR\n"  # 4: bad
        ',US,"no\nid"\n'  # 5-6: bad
        "00Q000000000012,UK,x\n",  # 7
        encoding="utf-8",
    )
    return path


def test_ingest_jsonl_and_csv_with_bad_rows(
    cli_env: Path, engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jl = _write_jsonl(tmp_path / "leads.jsonl")
    code, out, err = run(capsys, "ingest", "--no-verify", "--org", "acme", str(jl))
    assert code == 3
    assert err.splitlines() == [
        f"{jl}:3: rejected: not valid JSON (Expecting property name enclosed in double quotes)",
        f"{jl}:5: rejected: missing CRM id (column 'Id')",
        f"{jl}:7: rejected: expected a JSON object",
        f"{jl}:10: rejected: not a Salesforce id",
    ]
    assert out == (
        f"{jl}: 4 new (3 assigned, 1 unassigned), 1 duplicate, 0 skipped, 4 rejected{OFFLINE}\n"
    )

    cs = _write_csv(tmp_path / "leads.csv")
    code, out, err = run(capsys, "ingest", "--no-verify", str(cs))
    assert code == 3
    assert err.splitlines() == [
        f"{cs}:4: rejected: expected 3 cells, found 2",
        f"{cs}:5: rejected: missing CRM id (column 'Id')",
    ]
    assert out == (
        f"{cs}: 2 new (2 assigned, 0 unassigned), 0 duplicate, 0 skipped, 2 rejected{OFFLINE}\n"
    )

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT l.crm_id, a.crm_user_id, l.unassigned_reason, l.source, l.fields "
                "FROM leads l LEFT JOIN assignments a ON a.lead_id = l.id ORDER BY l.crm_id"
            )
        ).all()
    # stored by their 18-character ids
    assert [tuple(r[:4]) for r in rows] == [
        ("00Q000000000001EAA", "005B", None, "import"),
        ("00Q000000000002EAA", "005C", None, "import"),
        ("00Q000000000003EAA", None, "no_rule_matched", "import"),
        ("00Q000000000004EAA", "005B", None, "import"),
        ("00Q000000000010EAA", "005A", None, "import"),
        ("00Q000000000012EAA", "005C", None, "import"),
    ]
    assert rows[4].fields == {"Id": "00Q000000000010", "Country": "US", "Note": "two\nlines"}
    before = table_counts(engine)
    assert before == {"leads": 6, "assignments": 5, "outbox": 5}

    # the same files again: every good row is a duplicate and nothing changes
    code, out, _ = run(capsys, "ingest", "--no-verify", str(jl))
    assert (code, out) == (
        3,
        f"{jl}: 0 new (0 assigned, 0 unassigned), 5 duplicate, 0 skipped, 4 rejected{OFFLINE}\n",
    )
    code, out, _ = run(capsys, "ingest", "--no-verify", str(cs))
    assert (code, out) == (
        3,
        f"{cs}: 0 new (0 assigned, 0 unassigned), 2 duplicate, 0 skipped, 2 rejected{OFFLINE}\n",
    )
    assert table_counts(engine) == before


def test_ingest_clean_file_exits_0(
    cli_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "leads.txt"
    path.write_text('{"Id": "00Q000000000001", "Country": "US"}\n', encoding="utf-8")
    code, _, err = run(capsys, "ingest", "--no-verify", str(path))
    assert code == 2
    assert err == (
        f"connector: {path}: cannot tell the format from the name; pass --format jsonl|csv\n"
    )
    code, out, err = run(capsys, "ingest", "--no-verify", "--format", "jsonl", str(path))
    assert (code, err) == (0, "")
    assert out == (
        f"{path}: 1 new (1 assigned, 0 unassigned), 0 duplicate, 0 skipped, 0 rejected{OFFLINE}\n"
    )


def test_ingest_missing_file(
    cfg_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "ingest", "--no-verify", str(tmp_path / "nope.csv"))
    assert (code, err) == (2, f"connector: {tmp_path / 'nope.csv'}: no such file\n")


def _check_status_shape(status: dict[str, Any]) -> None:
    assert set(status) == {"org", "leads", "teams", "outbox", "skipped", "inbox"}
    assert set(status["leads"]) == {"total", "assigned", "unassigned"}
    assert set(status["outbox"]) == {"pending", "sent", "dead", "superseded"}
    assert set(status["inbox"]) == {"pending", "dead"}
    for team in status["teams"]:
        assert set(team) == {"name", "members"}
        for m in team["members"]:
            assert {"crm_user_id", "name", "assigned"} <= set(m)


def now(state: str) -> dict[str, Any]:
    """A rep's state now as status --json gives it, for a state with no end."""
    return {"state": state, "until": None, "note": None, "text": state}


def day(leads: int, share: float, picks: int, passed: dict[str, int]) -> dict[str, Any]:
    """A rep's last 24 hours as status --json gives it (no rep is below its fair share)."""
    return {
        "leads": leads,
        "fair_share": share,
        "picks": picks,
        "passed_over": passed,
        "below_fair_share": None,
    }


def test_status_json(cli_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "ingest", "--no-verify", str(_write_jsonl(tmp_path / "leads.jsonl")))
    code, out, err = run(capsys, "status", "--org", "acme", "--json")
    assert (code, err) == (0, "")
    status = json.loads(out)
    _check_status_shape(status)
    assert status == {
        "org": "acme",
        "leads": {"total": 4, "assigned": 3, "unassigned": 1},
        "teams": [
            {
                "name": "na_ae",
                "members": [
                    {
                        "crm_user_id": "005A",
                        "name": "Ada",
                        "assigned": 0,
                        "weight": 1,
                        "active": True,
                        "now": now("available"),
                        "last_24h": day(0, 0.67, 2, {}),
                    },
                    {
                        "crm_user_id": "005B",
                        "name": "Alan",
                        "assigned": 2,
                        "weight": 2,
                        "active": True,
                        "now": now("available"),
                        "last_24h": day(2, 1.33, 2, {}),
                    },
                ],
            },
            {
                "name": "row_ae",
                "members": [
                    {
                        "crm_user_id": "005C",
                        "name": "Grace",
                        "assigned": 1,
                        "weight": 1,
                        "active": True,
                        "now": now("available"),
                        "last_24h": day(1, 1.0, 1, {}),
                    },
                    {
                        "crm_user_id": "005D",
                        "name": "Edsger",
                        "assigned": 0,
                        "weight": 1,
                        "active": False,
                        "now": now("inactive"),
                        "last_24h": day(0, 0.0, 1, {"inactive": 1}),
                    },
                ],
            },
        ],
        "skipped": {},
        "inbox": {"pending": 0, "dead": 0},
        "outbox": {"pending": 3, "sent": 0, "dead": 0, "superseded": 0},
    }
    code, out, _ = run(capsys, "status")
    assert code == 0 and out.startswith("org acme: 4 leads, 3 assigned, 1 unassigned\n")
    assert out.splitlines()[1:7] == [
        "team na_ae",
        "  REP   CRM USER  WEIGHT  ALL TIME  24H  FAIR 24H  NOW        WHY BELOW FAIR SHARE",
        "  Ada   005A           1         0    0       0.7  available",
        "  Alan  005B           2         2    2       1.3  available",
        "team row_ae",
        "  REP     CRM USER  WEIGHT  ALL TIME  24H  FAIR 24H  NOW        WHY BELOW FAIR SHARE",
    ]
    assert "  Edsger  005D           1         0    0       0.0  inactive" in out
    assert "outbox: 3 pending, 0 sent, 0 dead" in out


def test_status_unknown_org(cfg_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "status", "--org", "initech", "--json")
    assert (code, out) == (2, "")
    assert err == "connector: org 'initech' is not configured (known: acme)\n"


@pytest.mark.parametrize("argv", [["status"], ["migrate"], ["inbox", "list"]])
def test_database_down_exit_code_and_one_line(
    cfg_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """cfg_file's DATABASE_URL points at a closed port."""
    code, out, err = run(capsys, *argv)
    assert (code, out) == (69, "")
    assert err == (
        "connector: database unavailable: connection failed: connection to server at "
        '"127.0.0.1", port 9 failed: Connection refused\n'
    )


def test_database_error_exit_code(
    cli_env: Path, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database that refuses a statement (not an outage) exits 1 with the SQLSTATE only."""
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE intake_events CASCADE"))
    code, out, err = run(capsys, "inbox", "list", "--org", "acme")
    assert (code, out) == (1, "")
    assert err == "connector: database error: UndefinedTable (SQLSTATE 42P01)\n"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["purge", "--days", "0"],
            "connector purge: argument --days: 0 is out of range (1 to 36600)",
        ),
        (
            ["ingest", "--batch-size", "-1", "x"],
            "connector ingest: argument --batch-size: -1 is out of range (1 to 2147483647)",
        ),
    ],
)
def test_bad_numbers_are_usage_errors(
    cfg_file: Path, capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_a_value_error_from_a_bug_is_not_a_usage_error(
    cfg_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only UsageError and ConfigError exit 2; anything else keeps its traceback."""
    import connector.shell.cli as cli

    def broken(args: Any) -> int:
        raise ValueError("team has no active member")

    monkeypatch.setattr(cli, "cmd_check_config", broken)
    with pytest.raises(ValueError, match="team has no active member"):
        main(["check-config"])


def test_auto_migrate_off_refuses_an_old_schema(
    databases: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from testbed.pg import blank_database

    cfg = tmp_path / "acme.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", blank_database(databases, "cli_old_schema"))
    monkeypatch.setenv("ACME_TOKEN", TOKEN)
    monkeypatch.setenv("ACME_OM", "om-url-secret-0123456789abcdef")
    monkeypatch.setenv("CONNECTOR_AUTO_MIGRATE", "0")
    code, out, err = run(capsys, "--config", str(cfg), "status", "--json")
    assert (code, out) == (2, "")
    pending = [m.version for m in db.migrations()]  # a blank database: every one
    assert err == (
        f"connector: database schema is behind (pending migrations {pending}): run "
        "`connector migrate`\n"
    )


# --- acceptance: real processes at once ------------------------------------------------------

FILES, LEADS, REPS = 16, 10_000, 10


def _connector() -> list[str]:
    exe = Path(sys.executable).with_name("connector")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "connector"]


def _run_all(
    argvs: list[list[str]], env: dict[str, str], folder: Path
) -> list[subprocess.CompletedProcess[str]]:
    """``connector ARGV`` for each, all at once, each a process of its own forked from the
    fork server (testbed/processes.py: the same main() without an interpreter start's ~0.8 s
    of imports each); their stdout and stderr kept apart."""
    folder.mkdir(exist_ok=True)
    started = []
    for argv in argvs:
        n = len(list(folder.iterdir()))
        out, err = folder / f"{n}.out", folder / f"{n}.err"
        started.append((Forked(argv, env, out, Path.cwd(), err), out, err))
    return [finish(proc, out, err) for proc, out, err in started]


@pytest.mark.slow
def test_16_ingest_processes_at_once(db_url: str, engine: Engine, tmp_path: Path) -> None:
    members = "\n".join(
        f'      - {{crm_user_id: "005{i:015d}", name: "Rep {i}"}}' for i in range(REPS)
    )
    cfg = tmp_path / "acme.yaml"
    cfg.write_text(
        CONFIG.split("teams:")[0] + f"teams:\n  - name: all\n    members:\n{members}\n"
        "rules:\n  - {team: all}\n",
        encoding="utf-8",
    )
    files = []
    for f in range(FILES):
        path = tmp_path / (f"part{f:02d}.jsonl" if f % 2 else f"part{f:02d}.csv")
        ids = [f"00Q{i:012d}" for i in range(f, LEADS, FILES)]
        if f % 2:
            body = "".join(json.dumps({"Id": x, "Country": "US"}) + "\n" for x in ids)
        else:
            body = "Id,Country\n" + "".join(f"{x},US\n" for x in ids)
        path.write_text(body, encoding="utf-8")
        files.append(path)
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "ACME_TOKEN": TOKEN,
        "ACME_OM": OM,
        "CONNECTOR_CONFIG": str(cfg),
    }
    env.pop("CONNECTOR_AUTO_MIGRATE", None)
    cmds = [["ingest", "--no-verify", "--org", "acme", str(p)] for p in files]

    results = _run_all(cmds, env, tmp_path / "first")
    assert [(r.returncode, r.stderr) for r in results] == [(0, "")] * FILES
    assert sum(int(r.stdout.split(": ")[1].split(" new")[0]) for r in results) == LEADS

    def status() -> dict[str, Any]:
        r = subprocess.run(
            [*_connector(), "status", "--json"], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        parsed: dict[str, Any] = json.loads(r.stdout)
        _check_status_shape(parsed)
        return parsed

    first = status()
    assert first["leads"] == {"total": LEADS, "assigned": LEADS, "unassigned": 0}
    assert first["outbox"] == {"pending": LEADS, "sent": 0, "dead": 0, "superseded": 0}
    got = [m["assigned"] for m in first["teams"][0]["members"]]
    assert len(got) == REPS and sum(got) == LEADS
    assert max(got) - min(got) <= 1, got
    before = table_counts(engine)

    again = _run_all(cmds, env, tmp_path / "again")
    assert [r.returncode for r in again] == [0] * FILES
    for r in again:
        assert " 0 new (0 assigned, 0 unassigned), " in r.stdout
    assert sum(int(r.stdout.split("), ")[1].split(" duplicate")[0]) for r in again) == LEADS
    assert status() == first
    assert table_counts(engine) == before == {"leads": LEADS, "assignments": LEADS, "outbox": LEADS}


# --- check-config --online against a CRM that refuses or cannot be reached -------------------


def _sf_org_yaml(org: str, url: str, secret_var: str, owner: str) -> str:
    return f"""
org: {org}
crm:
  kind: salesforce
  instance_url: {url}
  auth: {{method: client_credentials, client_id: "${{SF_ID}}", client_secret: "${{{secret_var}}}"}}
  organization_id: 00D5g000004ABCDEA4
  outbound_secrets: ["${{SF_OM}}"]
intake_owner_ids: ["00G000000000001"]
teams:
  - name: ae
    members: [{{crm_user_id: "{owner}", name: Rep}}]
rules: [{{team: ae}}]
"""


def test_check_config_online_reports_crm_errors_per_org(tmp_path: Path) -> None:
    from crm_sandboxes import SalesforceSandbox

    wrong = "wrong-secret-never-printed"
    sf = SalesforceSandbox(record_work_ms=0.0).start()
    # bound but not listening: connections to it are refused, and no other process can take it
    closed = socket.socket()
    try:
        closed.bind(("127.0.0.1", 0))
        gone_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        owner = sf.add_user()
        folder = tmp_path / "orgs"
        folder.mkdir()
        for org, url, var in (
            ("badauth", sf.url, "SF_WRONG"),
            ("good", sf.url, "SF_SECRET"),
            ("unreachable", gone_url, "SF_SECRET"),
        ):
            (folder / f"{org}.yaml").write_text(
                _sf_org_yaml(org, url, var, owner), encoding="utf-8"
            )
        env = {
            **os.environ,
            "SF_ID": sf.client_id,
            "SF_SECRET": sf.client_secret,
            "SF_WRONG": wrong,
            "SF_OM": "om-url-secret-0123456789abcdef",
        }
        env.pop("CONNECTOR_CONFIG", None)
        r = subprocess.run(
            [*_connector(), "check-config", "--online", "--config", str(folder)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        closed.close()
        sf.stop()
    assert "Traceback" not in r.stdout + r.stderr
    for secret in (wrong, sf.client_secret):
        assert secret not in r.stdout + r.stderr
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "org badauth: cannot check owners in the CRM: invalid_grant: authentication failure",
        "org unreachable: cannot check owners in the CRM: connection: ConnectionError",
    ]
    # the org in between is still checked
    assert r.stdout.splitlines()[-1] == "org good: 1 of 1 active owners verified in the CRM"


# --- --config and --log-level before or after the command ------------------------------------


@pytest.fixture
def globex_file(cfg_file: Path, tmp_path: Path) -> Path:
    """A second config (org globex) next to the acme one that CONNECTOR_CONFIG names."""
    path = tmp_path / "globex.yaml"
    path.write_text(CONFIG.replace("org: acme", "org: globex"), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "{globex}", "check-config"],
        ["check-config", "--config", "{globex}"],
        ["--config", "{acme}", "check-config", "--config", "{globex}"],  # after wins
    ],
)
def test_config_before_or_after_check_config(
    cfg_file: Path, globex_file: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(acme=cfg_file, globex=globex_file) for a in argv]
    code, out, err = run(capsys, *argv)
    assert (code, err) == (0, "")
    assert out.startswith("org globex: salesforce Lead, 2 teams")


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "{globex}", "status", "--org", "initech"],
        ["status", "--org", "initech", "--config", "{globex}"],
        ["--config", "{acme}", "status", "--config", "{globex}", "--org", "initech"],
        ["--config", "{globex}", "ingest", "--org", "initech", "leads.csv"],
        ["ingest", "--config", "{globex}", "--org", "initech", "leads.csv"],
        ["--config", "{acme}", "ingest", "--org", "initech", "--config", "{globex}", "x.csv"],
        ["sync", "--once", "--org", "initech", "--config", "{globex}"],
    ],
)
def test_config_before_or_after_other_commands(
    cfg_file: Path, globex_file: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(acme=cfg_file, globex=globex_file) for a in argv]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err == "connector: org 'initech' is not configured (known: globex)\n"


def test_log_level_before_or_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from connector.shell.cli import build_parser

    monkeypatch.delenv("CONNECTOR_LOG_LEVEL", raising=False)

    def parsed(*argv: str) -> tuple[str | None, str]:
        args = build_parser().parse_args(list(argv))
        return args.config, args.log_level

    assert parsed("migrate") == (None, "WARNING")
    assert parsed("--log-level", "DEBUG", "migrate") == (None, "DEBUG")
    assert parsed("migrate", "--log-level", "DEBUG") == (None, "DEBUG")
    assert parsed("--log-level", "INFO", "status", "--log-level", "ERROR") == (None, "ERROR")
    # a value given only before the command survives the subcommand's parsing
    assert parsed("--config", "a", "--log-level", "INFO", "outbox", "list") == ("a", "INFO")
    assert parsed("--config", "a", "demo", "--config", "b") == ("b", "WARNING")
    monkeypatch.setenv("CONNECTOR_LOG_LEVEL", "ERROR")
    assert parsed("sandbox", "hubspot") == (None, "ERROR")
    assert parsed("sandbox", "hubspot", "--log-level", "INFO") == (None, "INFO")


def test_help_says_global_options_go_before_or_after(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["check-config", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = " ".join(capsys.readouterr().out.split())
        assert "--config FILE_OR_FOLDER" in out
        assert (
            "May come before or after the command; given in both places, the one after wins." in out
        )


def test_dispatch_admin_port_in_use_is_a_one_line_usage_error(
    cli_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`connector dispatch --admin-port P` with P taken: exit 2 with what to do, before any
    dispatcher or signal handler is set up (no traceback)."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run(capsys, "dispatch", "--admin-port", str(port))
    assert (code, out) == (2, "")
    assert err.endswith(
        f"connector: the admin listener could not listen on 127.0.0.1:{port} (is the port in "
        "use?)\n"
    )
    assert "Traceback" not in err
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_dispatch_admin_listener_off_loopback_needs_a_token(
    cli_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONNECTOR_ADMIN_TOKEN", raising=False)
    code, out, err = run(capsys, "dispatch", "--admin-port", "9", "--admin-host", "0.0.0.0")
    assert (code, out) == (2, "")
    assert err == (
        "connector: the admin listener on 0.0.0.0 is reachable from other machines: set "
        "CONNECTOR_ADMIN_TOKEN, or bind it to 127.0.0.1 (--admin-host)\n"
    )


def test_a_short_admin_token_stops_the_start(
    cli_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONNECTOR_ADMIN_TOKEN", "x")
    for argv in (("dispatch", "--admin-port", "9"), ("serve", "--port", "9", "--admin-port", "9")):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), argv
        assert err == (
            "connector: CONNECTOR_ADMIN_TOKEN is 1 characters; use at least 32 (e.g. python3 -c "
            '"import secrets; print(secrets.token_urlsafe(32))")\n'
        ), argv


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "CONNECTOR_MAX_CONNECTIONS",
            "many",
            "CONNECTOR_MAX_CONNECTIONS must be a whole number, got 'many'",
        ),
        ("CONNECTOR_MAX_CONNECTIONS", "0", "CONNECTOR_MAX_CONNECTIONS must be at least 1"),
        (
            "CONNECTOR_MAX_CONNECTIONS_PER_PEER",
            "-3",
            "CONNECTOR_MAX_CONNECTIONS_PER_PEER must be a whole number, got '-3'",
        ),
        (
            "CONNECTOR_MAX_UNAUTHENTICATED_BYTES",
            "10",
            "CONNECTOR_MAX_UNAUTHENTICATED_BYTES must be a whole number of bytes, at least 65536,"
            " got '10'",
        ),
        (
            "CONNECTOR_ADMIN_SESSION_SECONDS",
            "forever",
            "CONNECTOR_ADMIN_SESSION_SECONDS must be a whole number of seconds from 60 to"
            " 31622400, got 'forever'",
        ),
    ],
)
def test_listener_settings_are_checked_at_start(
    cli_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: str,
    message: str,
) -> None:
    monkeypatch.setenv(name, value)
    code, out, err = run(capsys, "serve", "--port", "9", "--admin-port", "9")
    assert (code, out, err) == (2, "", f"connector: {message}\n")


def test_a_file_limit_too_small_for_the_pools_stops_the_start(
    cli_env: Path, db_url: str, engine: Engine
) -> None:
    """The soft and hard open-file limits at 250: the pools, CRM clients and the admin
    listener need more than that leaves room for, so `connector serve` refuses in one line."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (250, 250))

    done = subprocess.run(
        [*_connector(), "serve", "--port", "9"],
        env={**os.environ, "DATABASE_URL": db_url, "CONNECTOR_AUTO_MIGRATE": "1"},
        preexec_fn=low_limit,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert re.fullmatch(
        r"connector: the open-file limit \(250\) leaves \d+ connections after the \d+ files "
        r"the database pools, CRM clients and admin listener need; raise it \(ulimit -n, the "
        r"hard limit\) to at least \d+",
        lines[0],
    ), lines[0]


def test_dispatch_once_takes_no_admin_port(
    cfg_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "dispatch", "--once", "--admin-port", "9")
    assert (code, out) == (2, "")
    assert err == (
        "connector: dispatch: --admin-port serves a running dispatcher; --once drains and exits\n"
    )
