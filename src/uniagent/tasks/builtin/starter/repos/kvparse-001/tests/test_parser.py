import pytest

from kvparse import ParseError, loads


def test_basic_pairs():
    assert loads("name = demo\nport=8080\n") == {"name": "demo", "port": "8080"}


def test_comments_and_blank_lines():
    text = "# header\n\nname = demo  # trailing comment\n   # indented comment\n"
    assert loads(text) == {"name": "demo"}


def test_later_assignment_wins():
    assert loads("a = 1\na = 2") == {"a": "2"}


def test_quoted_value_keeps_spaces():
    assert loads('greeting = "  hello world  "') == {"greeting": "  hello world  "}


def test_simple_escapes():
    assert loads(r'msg = "line1\nline2\tend \"quoted\""') == {"msg": 'line1\nline2\tend "quoted"'}


def test_equals_sign_in_value():
    assert loads("expr = a=b") == {"expr": "a=b"}


@pytest.mark.parametrize("text", ["just text", "= value", "bad key = 1", 'x = "open'])
def test_errors(text):
    with pytest.raises(ParseError):
        loads(text)
