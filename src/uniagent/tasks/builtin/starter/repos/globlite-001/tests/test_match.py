import pytest

from globlite import filter_names, match, match_any


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("*.py", "setup.py"),
        ("*.py", ".py"),
        ("test_*.py", "test_cli.py"),
        ("data_??.csv", "data_07.csv"),
        ("report[0-9].txt", "report3.txt"),
        ("[!.]*", "README"),
        ("*_v*", "model_v2"),
        ("a*b*c", "aXbYc"),
        (r"\*.md", "*.md"),
        ("[]x]", "]"),
        ("[abc", "[abc"),
    ],
)
def test_matches(pattern, name):
    assert match(pattern, name)


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("*.py", "setup.pyc"),
        ("test_*.py", "conftest.py"),
        ("data_??.csv", "data_7.csv"),
        ("report[0-9].txt", "reportX.txt"),
        ("[!.]*", ".hidden"),
        (r"\*.md", "x.md"),
        ("a*b*c", "aXbY"),
    ],
)
def test_does_not_match(pattern, name):
    assert not match(pattern, name)


def test_ignore_case():
    assert match("*.JPG", "holiday.jpg", ignore_case=True)
    assert not match("*.JPG", "holiday.jpg")


def test_match_any_and_filter():
    names = ["a.py", "b.txt", "c.pyi", "d.md"]
    assert filter_names(names, "*.py?") == ["c.pyi"]
    assert match_any(["*.md", "*.txt"], "b.txt")
    assert not match_any([], "b.txt")
