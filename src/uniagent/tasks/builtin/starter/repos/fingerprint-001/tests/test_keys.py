import pytest

from fingerprint import canonical_json, fingerprint


def test_canonical_json_is_compact():
    assert canonical_json({"a": [1, 2.5, None, True]}) == '{"a":[1,2.5,null,true]}'


def test_fingerprint_is_deterministic_and_sized():
    fp = fingerprint({"model": "small", "epochs": 3})
    assert fp == fingerprint({"model": "small", "epochs": 3})
    assert len(fp) == 16
    assert len(fingerprint([1], length=64)) == 64


def test_different_values_differ():
    assert fingerprint({"lr": 0.1}) != fingerprint({"lr": 0.01})
    assert fingerprint([1, 2]) != fingerprint([2, 1])


def test_non_ascii_text():
    assert canonical_json("naïve") == '"na\\u00efve"'


@pytest.mark.parametrize("bad", [float("nan"), {1: "x"}, object()])
def test_rejects_unsupported(bad):
    with pytest.raises((TypeError, ValueError)):
        fingerprint(bad)
