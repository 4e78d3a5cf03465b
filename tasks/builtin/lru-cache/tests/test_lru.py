import time

import pytest

from lru import LRUCache


def test_eviction_order():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "b" not in cache
    assert cache.keys() == ["a", "c"]


def test_update_moves_to_front():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10 and cache.get("b", "gone") == "gone"
    assert len(cache) == 2


def test_contains_does_not_touch():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache
    cache.put("c", 3)
    assert cache.keys() == ["b", "c"]


@pytest.mark.parametrize("capacity", [0, -3])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError):
        LRUCache(capacity)


def test_scales():
    # 200k operations on a 50k cache: a linear scan per call would take minutes.
    cache = LRUCache(50_000)
    start = time.monotonic()
    for i in range(100_000):
        cache.put(i, i)
        cache.get(i - 10)
    assert len(cache) == 50_000 and cache.get(99_999) == 99_999
    assert time.monotonic() - start < 20
