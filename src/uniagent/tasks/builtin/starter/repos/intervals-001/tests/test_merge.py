import pytest

from intervals import Interval, merge, total_length


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [Interval(1, 6), Interval(8, 10)]


def test_merge_touching_endpoints():
    assert merge([(1, 3), (3, 5)]) == [Interval(1, 5)]


def test_merge_unsorted_disjoint_input():
    assert merge([(8, 9), (1, 2), (4, 5)]) == [Interval(1, 2), Interval(4, 5), Interval(8, 9)]


def test_merge_empty():
    assert merge([]) == []


def test_invalid_interval_rejected():
    with pytest.raises(ValueError):
        merge([(5, 1)])


def test_total_length_counts_overlap_once():
    assert total_length([(0, 4), (2, 6)]) == 6
