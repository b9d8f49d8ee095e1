import pytest

from semver import Version


def test_parse_and_str_roundtrip():
    for text in ["1.2.3", "0.0.1-alpha", "2.0.0-rc.1+build.5", "10.20.30+meta"]:
        assert str(Version.parse(text)) == text


def test_leading_v_allowed():
    assert Version.parse("v1.4.0") == Version(1, 4, 0)


@pytest.mark.parametrize("bad", ["1.2", "01.2.3", "1.2.3-", "1.2.3+", "a.b.c", "1.2.3-alpha..1"])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        Version.parse(bad)


def test_numeric_core_ordering():
    assert Version.parse("1.10.0") > Version.parse("1.9.9")
    assert Version.parse("2.0.0") > Version.parse("1.99.99")


def test_prerelease_identifiers_compare_lexically():
    assert Version.parse("1.0.0-alpha") < Version.parse("1.0.0-beta")
    assert Version.parse("1.0.0-beta") < Version.parse("1.0.0-rc")


def test_build_metadata_ignored():
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")
    assert len({Version.parse("1.0.0+a"), Version.parse("1.0.0+b")}) == 1


def test_bump():
    v = Version.parse("1.2.3-rc.1")
    assert str(v.bump("patch")) == "1.2.4"
    assert str(v.bump("minor")) == "1.3.0"
    assert str(v.bump("major")) == "2.0.0"
