from kvparse import dumps, loads


def test_dumps_plain_values():
    assert dumps({"a": "1", "b": "two"}) == "a = 1\nb = two\n"


def test_roundtrip_simple():
    settings = {"name": "demo", "motd": "hello there", "multi": "a\nb"}
    assert loads(dumps(settings)) == settings


def test_dumps_empty():
    assert dumps({}) == ""
