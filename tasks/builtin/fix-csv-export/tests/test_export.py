import csv
import io

from export import to_csv

COLUMNS = ["id", "name", "note", "amount"]
ROWS = [
    {"id": 1, "name": "Smith, John", "note": 'said "hi"', "amount": 3.5},
    {"id": 2, "name": "Ann", "note": "line one\nline two", "amount": None},
    {"id": 3, "name": "Bob"},
]


def parse(text):
    return list(csv.reader(io.StringIO(text, newline="")))


def test_round_trip_through_csv_module():
    assert parse(to_csv(ROWS, COLUMNS)) == [
        COLUMNS,
        ["1", "Smith, John", 'said "hi"', "3.5"],
        ["2", "Ann", "line one\nline two", ""],
        ["3", "Bob", "", ""],
    ]


def test_minimal_quoting_and_crlf():
    assert to_csv([{"a": "x", "b": 'q"q'}], ["a", "b"]) == 'a,b\r\nx,"q""q"\r\n'


def test_empty_rows_give_header_only():
    assert to_csv([], ["a"]) == "a\r\n"
