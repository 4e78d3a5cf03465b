from calc import add, mul


def test_add_small():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-4, 1) == -3


def test_mul_still_works():
    assert mul(3, 4) == 12
