from semver import Version, latest, max_satisfying


def test_latest_ignores_prereleases_by_default():
    assert latest(["1.0.0", "1.2.0", "1.3.0-beta"]) == Version(1, 2, 0)


def test_latest_empty():
    assert latest([]) is None


def test_max_satisfying_range():
    candidates = ["1.0.0", "1.4.2", "1.9.0", "2.0.1"]
    assert max_satisfying(candidates, "1.2.0", "2.0.0") == Version(1, 9, 0)
    assert max_satisfying(candidates, "3.0.0", "4.0.0") is None
