import pytest

from pager import PageNotFound, paginate

ITEMS = list(range(1, 26))  # 25 items


def test_first_page():
    page = paginate(ITEMS, 1, per_page=10)
    assert page.items == list(range(1, 11))
    assert page.total_pages == 3
    assert page.has_next and not page.has_previous


def test_partial_last_page():
    page = paginate(ITEMS, 3, per_page=10)
    assert page.items == [21, 22, 23, 24, 25]
    assert (page.start_index, page.end_index) == (21, 25)
    assert not page.has_next


def test_empty_sequence_has_one_page():
    page = paginate([], 1)
    assert page.total_pages == 1
    assert page.items == []
    assert (page.start_index, page.end_index) == (0, 0)


def test_page_out_of_range():
    with pytest.raises(PageNotFound):
        paginate(ITEMS, 4, per_page=10)
    with pytest.raises(PageNotFound):
        paginate(ITEMS, 0, per_page=10)


def test_invalid_per_page():
    with pytest.raises(ValueError):
        paginate(ITEMS, 1, per_page=0)
