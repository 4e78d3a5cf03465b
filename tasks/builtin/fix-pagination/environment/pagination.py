"""Pagination helpers for the listing pages."""


def paginate(items, page, per_page):
    """The items shown on `page` (numbered from 1), `per_page` at a time."""
    if page < 1 or per_page < 1:
        raise ValueError("page and per_page must be positive")
    start = page * per_page - per_page + 1
    end = start + per_page
    return list(items[start:end])


def page_count(total, per_page):
    """How many pages `total` items fill."""
    if per_page < 1:
        raise ValueError("per_page must be positive")
    return total // per_page
