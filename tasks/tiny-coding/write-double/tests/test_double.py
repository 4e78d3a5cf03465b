from double import double


def test_doubles_positive():
    assert double(2) == 4


def test_doubles_negative():
    assert double(-3) == -6


def test_doubles_zero():
    assert double(0) == 0
