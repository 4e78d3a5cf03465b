"""Areas and perimeters of the shapes our drawing tool supports."""

import math


def area(shape):
    kind = shape["kind"]
    if kind == "circle":
        return math.pi * shape["radius"] ** 2
    elif kind == "rectangle":
        return float(shape["width"] * shape["height"])
    elif kind == "square":
        return float(shape["side"] ** 2)
    else:
        raise ValueError(f"unknown shape kind {kind!r}")


def perimeter(shape):
    kind = shape["kind"]
    if kind == "circle":
        return 2 * math.pi * shape["radius"]
    elif kind == "rectangle":
        return float(2 * (shape["width"] + shape["height"]))
    elif kind == "square":
        return float(4 * shape["side"])
    else:
        raise ValueError(f"unknown shape kind {kind!r}")
