"""connector.intake.importer: parsing JSON lines and CSV (pure; no database)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from connector.core.crm_kinds import SALESFORCE
from connector.intake.importer import Rejected, detect_format, parse_csv, parse_jsonl, read_file
from connector.routing.assign import Lead


def jsonl(text: str, id_field: str = "Id") -> list[tuple[int, Lead | Rejected]]:
    return list(parse_jsonl(io.StringIO(text, newline=None), id_field))


def csv_rows(text: str, id_field: str = "Id") -> list[tuple[int, Lead | Rejected]]:
    return list(parse_csv(io.StringIO(text, newline=""), id_field))


def test_jsonl_good_rows_and_blank_lines() -> None:
    text = '{"Id": "00Q1", "Country": "US"}\n\n   \n{"Id": " 00Q2 ", "n": 3}\n'
    assert jsonl(text) == [
        (1, Lead("00Q1", {"Id": "00Q1", "Country": "US"})),
        (4, Lead("00Q2", {"Id": " 00Q2 ", "n": 3})),
    ]


def test_jsonl_rejections_carry_line_numbers() -> None:
    text = "\n".join(
        [
            '{"Id": "a"}',
            "{not json",
            "",
            "[1, 2]",
            '"text"',
            '{"Country": "US"}',
            '{"Id": ""}',
            '{"Id": "' + "x" * 65 + '"}',
            '{"Id": "b", "Note": "x\\u0000y"}',
            '{"Id": "c\\u0007"}',
            '{"Id": 42}',
        ]
    )
    assert jsonl(text) == [
        (1, Lead("a", {"Id": "a"})),
        (2, Rejected(2, "not valid JSON (Expecting property name enclosed in double quotes)")),
        (4, Rejected(4, "expected a JSON object")),
        (5, Rejected(5, "expected a JSON object")),
        (6, Rejected(6, "missing CRM id (column 'Id')")),
        (7, Rejected(7, "missing CRM id (column 'Id')")),
        (8, Rejected(8, "CRM id longer than 64 characters")),
        (9, Rejected(9, "a field contains a NUL character")),
        (10, Rejected(10, "CRM id contains control characters")),
        (11, Lead("42", {"Id": 42})),
    ]


def test_jsonl_id_field() -> None:
    assert jsonl('{"id": "501"}\n{"Id": "x"}\n', "id") == [
        (1, Lead("501", {"id": "501"})),
        (2, Rejected(2, "missing CRM id (column 'id')")),
    ]


def test_csv_good_rows_blank_lines_and_empty_cells() -> None:
    text = "Id,Country,Industry\r\n00Q1,US,Tech\r\n\r\n,,\r\n00Q2, ,Bio\r\n"
    assert csv_rows(text) == [
        (2, Lead("00Q1", {"Id": "00Q1", "Country": "US", "Industry": "Tech"})),
        (5, Lead("00Q2", {"Id": "00Q2", "Country": None, "Industry": "Bio"})),
    ]


def test_csv_rejections_carry_line_numbers_across_multiline_cells() -> None:
    text = (
        "Id,Country,Note\n"  # 1
        '00Q1,US,"first\nsecond\nthird"\n'  # 2-4
        "00Q2,CA\n"  # 5: too few cells
        "\n"  # 6: blank
        '00Q3,DE,"a ""quoted"" word"\n'  # 7
        ",FR,no id\n"  # 8
        '00Q4,UK,"two\nlines",extra\n'  # 9-10: too many cells
        "00Q5,US,ok\n"  # 11
    )
    assert csv_rows(text) == [
        (2, Lead("00Q1", {"Id": "00Q1", "Country": "US", "Note": "first\nsecond\nthird"})),
        (5, Rejected(5, "expected 3 cells, found 2")),
        (7, Lead("00Q3", {"Id": "00Q3", "Country": "DE", "Note": 'a "quoted" word'})),
        (8, Rejected(8, "missing CRM id (column 'Id')")),
        (9, Rejected(9, "expected 3 cells, found 4")),
        (11, Lead("00Q5", {"Id": "00Q5", "Country": "US", "Note": "ok"})),
    ]


def test_csv_header_without_id_column() -> None:
    assert csv_rows("id,Country\n1,US\n") == [(1, Rejected(1, "header has no 'Id' column"))]


def test_csv_empty_file() -> None:
    assert csv_rows("") == []


def test_csv_header_is_trimmed_and_bom_stripped() -> None:
    assert csv_rows("\ufeff Id , Country\n00Q1,US\n") == [
        (2, Lead("00Q1", {"Id": "00Q1", "Country": "US"}))
    ]


@pytest.mark.parametrize("name", ["leads.jsonl", "leads.csv"])
def test_read_file_strips_bom(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    body = '{"Id": "00Q1"}\n' if name.endswith("jsonl") else "Id\r\n00Q1\r\n"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    fmt = detect_format(path)
    rows = list(read_file(path, fmt, "Id"))
    assert [(n, x.crm_id) for n, x in rows if isinstance(x, Lead)] == [
        (1 if fmt == "jsonl" else 2, "00Q1")
    ]


def test_read_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path: Path) -> None:
    """U+2028 and U+0085 are legal unescaped in JSON strings; they do not end a line."""
    path = tmp_path / "leads.jsonl"
    path.write_bytes(
        (
            '{"Id": "a", "Note": "x\u2028y"}\r\n{"Id": "b", "Note": "p\x85q"}\n\n{"Id": "c"}\n{bad'
        ).encode()
    )
    rows = list(read_file(path, "jsonl", "Id"))
    assert rows == [
        (1, Lead("a", {"Id": "a", "Note": "x\u2028y"})),
        (2, Lead("b", {"Id": "b", "Note": "p\x85q"})),
        (4, Lead("c", {"Id": "c"})),
        (5, Rejected(5, "not valid JSON (Expecting property name enclosed in double quotes)")),
    ]


def test_read_csv_keeps_crlf_inside_quoted_cells(tmp_path: Path) -> None:
    path = tmp_path / "leads.csv"
    path.write_bytes(b'Id,Note\r\n00Q1,"a\r\nb"\r\n00Q2\r\n')
    assert list(read_file(path, "csv", "Id")) == [
        (2, Lead("00Q1", {"Id": "00Q1", "Note": "a\r\nb"})),
        (4, Rejected(4, "expected 2 cells, found 1")),
    ]


def test_read_file_refuses_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "leads.csv"
    path.write_bytes(b"Id,Name\n00Q1,Jos\xe9\n")
    with pytest.raises(ValueError) as info:
        read_file(path, "csv", "Id")
    assert str(info.value) == f"{path}: not UTF-8 text (byte 16)"


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.jsonl", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("a.json", "jsonl"),
        ("A.JSONL", "jsonl"),
        ("a.csv", "csv"),
        ("b.CSV", "csv"),
    ],
)
def test_detect_format(name: str, fmt: str) -> None:
    assert detect_format(Path(name)) == fmt


@pytest.mark.parametrize("name", ["leads.txt", "leads", "leads.csv.gz"])
def test_detect_format_refuses_unknown(name: str) -> None:
    with pytest.raises(ValueError) as info:
        detect_format(Path(name))
    assert str(info.value) == (
        f"{name}: cannot tell the format from the name; pass --format jsonl|csv"
    )


def test_salesforce_rows_need_salesforce_ids() -> None:
    text = (
        '{"Id": "00Q5g00000LmAbC"}\n'  # 15 characters
        '{"Id": "00q5g00000lmabceav"}\n'  # 18, case-folded
        '{"Id": "00Q1"}\n'
        '{"Id": "00Q5g00000LmAbC9"}\n'  # 16 characters
        '{"Id": "000000000000000BAA"}\n'  # the suffix marks a digit upper case
        '{"Id": "00Q5g00000LmAb!"}\n'
    )
    rows = list(parse_jsonl(io.StringIO(text, newline=None), "Id", ids=SALESFORCE))
    assert [(n, r.reason if isinstance(r, Rejected) else r.crm_id) for n, r in rows] == [
        (1, "00Q5g00000LmAbCEAV"),  # stored in its 18-character form
        (2, "00Q5g00000LmAbCEAV"),  # the case its suffix says
        (3, "not a Salesforce id"),
        (4, "not a Salesforce id"),
        (5, "not a Salesforce id"),
        (6, "not a Salesforce id"),
    ]
    # other CRMs' ids are not checked
    assert jsonl('{"Id": "00Q1"}\n') == [(1, Lead("00Q1", {"Id": "00Q1"}))]
    csv_text = "Id,Country\n00Q1,US\n00Q5g00000LmAbC,US\n"
    csv_rows_sf = list(parse_csv(io.StringIO(csv_text, newline=""), "Id", ids=SALESFORCE))
    assert csv_rows_sf == [
        (2, Rejected(2, "not a Salesforce id")),
        (3, Lead("00Q5g00000LmAbCEAV", {"Id": "00Q5g00000LmAbC", "Country": "US"})),
    ]
