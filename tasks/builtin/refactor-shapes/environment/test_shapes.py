import math

import pytest

from shapes import area, perimeter


def test_circle():
    assert area({"kind": "circle", "radius": 1}) == pytest.approx(math.pi)
    assert perimeter({"kind": "circle", "radius": 1}) == pytest.approx(2 * math.pi)


def test_rectangle_and_square():
    assert area({"kind": "rectangle", "width": 2, "height": 3}) == 6.0
    assert perimeter({"kind": "square", "side": 2}) == 8.0


def test_unknown_kind():
    with pytest.raises(ValueError):
        area({"kind": "hexagon"})
