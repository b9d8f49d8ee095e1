import pytest

from htmlesc import Markup, escape, unescape


def test_escape_specials():
    assert escape('<a href="x">Tom & Jerry\'s</a>') == (
        "&lt;a href=&quot;x&quot;&gt;Tom &amp; Jerry&#x27;s&lt;/a&gt;"
    )


def test_escape_without_quotes():
    assert escape("\"hi\" & 'bye'", quote=False) == "\"hi\" &amp; 'bye'"


def test_escape_is_idempotent_for_markup():
    once = escape("<b>")
    assert escape(once) == "&lt;b&gt;"
    assert isinstance(once, Markup)


def test_unescape_named_entities():
    assert unescape("&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;") == '<b>bold</b> & "quoted"'


def test_unescape_numeric_references():
    assert unescape("caf&#233; &#x263A;") == "café ☺"


@pytest.mark.parametrize("text", ["plain", "a < b", "x & y", "5 > 3 \"yes\""])
def test_roundtrip_simple(text):
    assert unescape(escape(text)) == text
