import pytest

from money import allocate, split_evenly


def test_split_evenly_distributes_remainder():
    assert split_evenly(1000, 3) == [334, 333, 333]


def test_split_evenly_negative():
    assert split_evenly(-100, 3) == [-34, -33, -33]


def test_allocate_by_weights():
    assert allocate(100, [1, 1, 1]) == [34, 33, 33]
    assert allocate(1000, [50, 30, 20]) == [500, 300, 200]


def test_allocate_rejects_zero_weights():
    with pytest.raises(ValueError):
        allocate(10, [0, 0])
