import ast
import inspect
import math
from pathlib import Path

import pytest

import shapes
from shapes import Circle, Rectangle, Square, area, from_dict, perimeter


def test_original_behaviour_kept():
    assert area({"kind": "circle", "radius": 2}) == pytest.approx(4 * math.pi)
    assert perimeter({"kind": "rectangle", "width": 2, "height": 5}) == 14.0
    assert area({"kind": "square", "side": 3}) == 9.0
    for fn in (area, perimeter):
        with pytest.raises(ValueError):
            fn({"kind": "hexagon"})


def test_classes():
    assert Circle(1).area() == pytest.approx(math.pi)
    assert Rectangle(2, 3).perimeter() == 10.0
    assert Square(4).area() == 16.0
    assert isinstance(Square(1), Rectangle)
    assert isinstance(Rectangle(1, 2).area(), float)


def test_from_dict():
    assert isinstance(from_dict({"kind": "circle", "radius": 1}), Circle)
    assert isinstance(from_dict({"kind": "square", "side": 1}), Square)
    with pytest.raises(ValueError):
        from_dict({"kind": "blob"})


def _compares_kind(fn) -> bool:
    tree = ast.parse(inspect.getsource(fn))
    return any(isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in ("circle", "rectangle", "square") for c in node.comparators) for node in ast.walk(tree))


def test_no_kind_switch_left_in_old_functions():
    assert not _compares_kind(area)
    assert not _compares_kind(perimeter)


def test_visible_tests_still_pass():
    assert (Path("/app/test_shapes.py").read_text() == (Path(__file__).parent / "test_shapes_original.py").read_text())
    assert shapes.__file__.startswith("/app")
