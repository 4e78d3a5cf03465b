import pytest

from pagination import page_count, paginate

ITEMS = list(range(1, 24))  # 23 items


def test_first_page_starts_with_first_item():
    assert paginate(ITEMS, 1, 10) == list(range(1, 11))


def test_middle_and_last_pages():
    assert paginate(ITEMS, 2, 10) == list(range(11, 21))
    assert paginate(ITEMS, 3, 10) == [21, 22, 23]


def test_past_the_end_is_empty():
    assert paginate(ITEMS, 4, 10) == []


def test_every_item_appears_once():
    seen = [x for p in range(1, page_count(len(ITEMS), 7) + 1) for x in paginate(ITEMS, p, 7)]
    assert seen == ITEMS


@pytest.mark.parametrize(("total", "per_page", "pages"), [(0, 5, 0), (5, 5, 1), (6, 5, 2), (23, 10, 3), (1, 1, 1)])
def test_page_count(total, per_page, pages):
    assert page_count(total, per_page) == pages


def test_invalid_arguments():
    with pytest.raises(ValueError):
        paginate(ITEMS, 0, 10)
    with pytest.raises(ValueError):
        paginate(ITEMS, 1, 0)
