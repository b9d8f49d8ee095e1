"""Split sequences into numbered pages and render page navigation."""

from pager.paginate import Page, PageNotFound, paginate
from pager.links import page_links

__all__ = ["Page", "PageNotFound", "page_links", "paginate"]
