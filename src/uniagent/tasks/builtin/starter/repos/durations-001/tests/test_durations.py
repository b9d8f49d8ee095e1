import pytest

from durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("1h30m", 5400),
        ("2d 4h", 187_200),
        ("1w", 604_800),
        ("2 hours", 7200),
        ("1 min 5 SEC", 65),
        ("  45m  ", 2700),
    ],
)
def test_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1h fast", "abc 5m", "10"])
def test_parse_rejects_junk(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_parse_rejects_non_string():
    with pytest.raises(TypeError):
        parse_duration(30)


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59, "59s"), (5400, "1h30m"), (694_861, "1w1d1h1m1s")])
def test_format(seconds, text):
    assert format_duration(seconds) == text


def test_roundtrip():
    for seconds in (1, 61, 3601, 90061, 1_000_000):
        assert parse_duration(format_duration(seconds)) == seconds
