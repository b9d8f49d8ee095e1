import pytest

from ratelimit import SlidingWindowLimiter


class FakeClock:
    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_allows_up_to_limit():
    clock = FakeClock()
    limiter = SlidingWindowLimiter(3, 10.0, clock=clock)
    assert [limiter.allow() for _ in range(4)] == [True, True, True, False]


def test_window_slides():
    clock = FakeClock()
    limiter = SlidingWindowLimiter(2, 10.0, clock=clock)
    assert limiter.allow() and limiter.allow()
    clock.now += 5
    assert not limiter.allow()
    clock.now += 5.5
    assert limiter.allow()


def test_keys_are_independent():
    clock = FakeClock()
    limiter = SlidingWindowLimiter(1, 60.0, clock=clock)
    assert limiter.allow("alice")
    assert limiter.allow("bob")
    assert not limiter.allow("alice")


def test_remaining_and_retry_after():
    clock = FakeClock()
    limiter = SlidingWindowLimiter(2, 30.0, clock=clock)
    assert limiter.remaining() == 2
    limiter.allow()
    clock.now += 10
    limiter.allow()
    assert limiter.remaining() == 0
    assert limiter.retry_after() == pytest.approx(20.0)


def test_reset():
    clock = FakeClock()
    limiter = SlidingWindowLimiter(1, 60.0, clock=clock)
    limiter.allow()
    limiter.reset()
    assert limiter.allow()


@pytest.mark.parametrize(("limit", "window"), [(0, 1.0), (1, 0.0)])
def test_invalid_configuration(limit, window):
    with pytest.raises(ValueError):
        SlidingWindowLimiter(limit, window)
