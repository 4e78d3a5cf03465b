from greet import greet


def test_greets_ann():
    assert greet("Ann") == "Hello, Ann"


def test_greets_anyone():
    assert greet("Bo") == "Hello, Bo"


def test_uses_the_name():
    assert greet("x").endswith("x")
