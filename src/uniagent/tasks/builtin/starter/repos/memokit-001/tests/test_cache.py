import pytest

from memokit import LRUCache


def test_evicts_least_recently_inserted():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]
    assert cache.stats.evictions == 1


def test_get_counts_as_use():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"]


def test_peek_does_not_count_as_use():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1
    cache.put("c", 3)
    assert "a" not in cache


def test_hit_and_miss_stats():
    cache = LRUCache(4)
    cache.put("x", 0)
    cache.get("x")
    cache.get("y")
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_on_evict_callback():
    evicted = []
    cache = LRUCache(1, on_evict=lambda k, v: evicted.append((k, v)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert evicted == [("a", 1)]


def test_overwrite_keeps_size():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("a", 2)
    assert len(cache) == 1
    assert cache.get("a") == 2


def test_invalid_maxsize():
    with pytest.raises(ValueError):
        LRUCache(0)
