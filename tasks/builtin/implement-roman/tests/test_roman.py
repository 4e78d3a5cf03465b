import pytest

from roman import from_roman, to_roman

KNOWN = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 1994: "MCMXCIV", 2024: "MMXXIV", 3999: "MMMCMXCIX"}


@pytest.mark.parametrize(("n", "s"), sorted(KNOWN.items()))
def test_to_roman(n, s):
    assert to_roman(n) == s


@pytest.mark.parametrize(("n", "s"), sorted(KNOWN.items()))
def test_from_roman(n, s):
    assert from_roman(s) == n


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 4000))


@pytest.mark.parametrize("n", [0, -1, 4000])
def test_to_roman_out_of_range(n):
    with pytest.raises(ValueError):
        to_roman(n)


@pytest.mark.parametrize("s", ["", "IIII", "IC", "VV", "abc", "MMMM", "iv"])
def test_from_roman_invalid(s):
    with pytest.raises(ValueError):
        from_roman(s)
