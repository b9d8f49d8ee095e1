from fingerprint import ResultCache


def test_cache_hits_for_same_params():
    cache = ResultCache()
    calls = []

    def train(lr, epochs):
        calls.append((lr, epochs))
        return lr * epochs

    assert cache.get_or_compute({"lr": 0.5, "epochs": 4}, train) == 2.0
    assert cache.get_or_compute({"lr": 0.5, "epochs": 4}, train) == 2.0
    assert calls == [(0.5, 4)]
    assert cache.computed == 1


def test_invalidate():
    cache = ResultCache()
    cache.get_or_compute({"x": 1}, lambda x: x)
    assert cache.invalidate({"x": 1})
    assert not cache.invalidate({"x": 1})
    assert len(cache) == 0
