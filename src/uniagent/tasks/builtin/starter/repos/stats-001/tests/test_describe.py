import pytest

from stats import mean, median, percentile, summarize


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_odd_and_even():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5


def test_percentile_zero_is_minimum():
    assert percentile([7, 3, 9, 1], 0) == 1


def test_percentile_single_value():
    assert percentile([42], 50) == 42
    assert percentile([42], 99) == 42


@pytest.mark.parametrize("p", [-1, 100.5])
def test_percentile_out_of_range(p):
    with pytest.raises(ValueError):
        percentile([1, 2, 3], p)


def test_empty_sample_rejected():
    with pytest.raises(ValueError):
        mean([])
    with pytest.raises(ValueError):
        percentile([], 10)


def test_summary_basic_fields():
    s = summarize([5, 1, 3])
    assert (s.count, s.minimum, s.median, s.maximum) == (3, 1, 3, 5)
    assert s.mean == 3
