from memokit import memoize


def test_memoize_calls_once_per_argument():
    calls = []

    @memoize(maxsize=8)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(4)] == [9, 9, 16]
    assert calls == [3, 4]


def test_memoize_respects_kwargs():
    @memoize()
    def greet(name, punctuation="!"):
        return f"hi {name}{punctuation}"

    assert greet("ann") == "hi ann!"
    assert greet("ann", punctuation="?") == "hi ann?"
    assert greet.cache.stats.misses == 2


def test_memoize_caches_none_results():
    calls = []

    @memoize()
    def nothing(x):
        calls.append(x)

    nothing(1)
    nothing(1)
    assert calls == [1]
