"""Roman numeral conversion."""


def to_roman(n: int) -> str:
    """The Roman numeral for 1 <= n <= 3999."""
    raise NotImplementedError


def from_roman(s: str) -> int:
    """The integer a canonical Roman numeral stands for."""
    raise NotImplementedError
