import pytest

from inventory import Inventory, OutOfStock


def test_add_accumulates():
    inv = Inventory()
    inv.add("apple", 3)
    inv.add("apple", 2)
    assert inv.count("apple") == 5


def test_unknown_sku_counts_zero():
    assert Inventory().count("pear") == 0


def test_remove_reduces_and_drops_empty():
    inv = Inventory()
    inv.add("apple", 3)
    inv.remove("apple", 3)
    assert inv.count("apple") == 0
    assert "apple" not in inv.items


def test_remove_more_than_stock_raises_and_keeps_stock():
    inv = Inventory()
    inv.add("apple", 1)
    with pytest.raises(OutOfStock):
        inv.remove("apple", 2)
    assert inv.count("apple") == 1


def test_total_counts_units():
    inv = Inventory()
    inv.add("apple", 2)
    inv.add("pear", 3)
    assert inv.total() == 5


@pytest.mark.parametrize("qty", [0, -1])
def test_non_positive_quantities_rejected(qty):
    with pytest.raises(ValueError):
        Inventory().add("apple", qty)
