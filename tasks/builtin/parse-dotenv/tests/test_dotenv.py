from pathlib import Path

import pytest

from dotenv import parse


def test_example_file():
    assert parse(Path("/app/example.env").read_text()) == {
        "DB_HOST": "localhost",
        "DB_PORT": "5432",
        "GREETING": "Hello,\nWorld",
        "RAW": "no \\n escapes here",
        "EMPTY": "",
    }


def test_quotes_and_escapes():
    text = 'A="say \\"hi\\"\\t\\\\"\nB=\'#not a comment\'\nC=plain # comment\n'
    assert parse(text) == {"A": 'say "hi"\t\\', "B": "#not a comment", "C": "plain"}


def test_later_lines_override_and_blank_lines_skip():
    assert parse("\n\nX=1\n   # note\nX=2\n") == {"X": "2"}


def test_value_may_contain_equals():
    assert parse("URL=http://h/?a=b") == {"URL": "http://h/?a=b"}


@pytest.mark.parametrize(("text", "line"), [("GOOD=1\nnot a pair\n", 2), ("1BAD=x", 1), ("A=1\nB=2\nBAD-KEY=3", 3)])
def test_errors_name_the_line(text, line):
    with pytest.raises(ValueError, match=str(line)):
        parse(text)
