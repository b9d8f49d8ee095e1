from pager import page_links, paginate


def test_links_with_ellipses():
    page = paginate(list(range(199)), 6, per_page=10)
    assert page_links(page) == [1, None, 4, 5, 6, 7, 8, None, 20]


def test_links_near_start():
    page = paginate(list(range(45)), 1, per_page=10)
    assert page_links(page) == [1, 2, 3, None, 5]
