from intervals import Interval, gaps, max_disjoint


def test_gaps_between_meetings():
    busy = [(9, 10), (11, 12.5), (14, 15)]
    assert gaps(busy, 9, 17) == [Interval(10, 11), Interval(12.5, 14), Interval(15, 17)]


def test_no_gaps_when_fully_covered():
    assert gaps([(0, 5), (5, 10)], 0, 10) == []


def test_max_disjoint_prefers_early_finishers():
    chosen = max_disjoint([(1, 4), (3, 5), (0, 6), (5, 7), (3, 9), (5, 9), (6, 10), (8, 11)])
    assert chosen == [Interval(1, 4), Interval(5, 7), Interval(8, 11)]
