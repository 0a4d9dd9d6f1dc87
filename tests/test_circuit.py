"""Circuit breakers (SPEC §7): closed → open → half-open → closed/open, driven by a fake clock."""

from __future__ import annotations

import pytest

from worker import errors
from worker.call.circuit import Breakers, CircuitBreaker


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def opened(clock: FakeClock, threshold: int = 3, cooldown_s: float = 30.0) -> CircuitBreaker:
    breaker = CircuitBreaker(threshold, cooldown_s, clock, name="support")
    for _ in range(threshold):
        breaker.before_call()
        breaker.record_failure()
    return breaker


def test_closed_lets_calls_through(clock: FakeClock) -> None:
    """A new breaker is closed and lets every call through."""
    breaker = CircuitBreaker(3, 30, clock)
    for _ in range(10):
        breaker.before_call()
    assert breaker.state == "closed"


def test_defaults() -> None:
    """The defaults are 5 consecutive failures and a 30 s cool-down."""
    breaker = CircuitBreaker()
    assert (breaker.threshold, breaker.cooldown_s) == (5, 30.0)


def test_opens_after_threshold_consecutive_failures(clock: FakeClock) -> None:
    """N consecutive failures open the circuit; N-1 do not."""
    breaker = CircuitBreaker(3, 30, clock)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "closed"
    breaker.record_failure()
    assert breaker.state == "open"


def test_success_resets_the_count(clock: FakeClock) -> None:
    """Failures must be consecutive: a success in between starts the count again."""
    breaker = CircuitBreaker(3, 30, clock)
    for _ in range(5):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "closed"  # two failures since the last success: below the threshold


def test_open_refuses_with_exit_69_and_when_to_retry(clock: FakeClock) -> None:
    """An open circuit refuses calls (exit 69) with a message that says when it is tried again."""
    breaker = opened(clock, threshold=5, cooldown_s=30)
    clock.advance(18.2)
    with pytest.raises(errors.UpstreamUnavailable) as info:
        breaker.before_call()
    assert info.value.exit_code == 69
    message = info.value.message
    assert "'support'" in message
    assert "opened after 5 consecutive failures" in message
    assert "retrying in 12 s" in message
    assert "not sent" in message


def test_retry_time_is_never_zero_while_open(clock: FakeClock) -> None:
    """Just before the cool-down ends the message says 1 s, not 0 s."""
    breaker = opened(clock, cooldown_s=30)
    clock.advance(29.99)
    with pytest.raises(errors.UpstreamUnavailable, match="retrying in 1 s"):
        breaker.before_call()


def test_half_open_after_cooldown_allows_one_trial(clock: FakeClock) -> None:
    """After the cool-down one trial call goes through; others are refused while it is out."""
    breaker = opened(clock, cooldown_s=30)
    clock.advance(30)
    assert breaker.state == "half_open"
    breaker.before_call()
    assert breaker.state == "half_open"
    with pytest.raises(errors.UpstreamUnavailable, match="trial call"):
        breaker.before_call()


def test_trial_success_closes(clock: FakeClock) -> None:
    """A successful trial closes the circuit and forgets the failures."""
    breaker = opened(clock, cooldown_s=30)
    clock.advance(31)
    breaker.before_call()
    breaker.record_success()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "closed"  # the failures before the trial are forgotten: two are below three
    breaker.before_call()
    breaker.before_call()


def test_trial_failure_opens_again_for_a_full_cooldown(clock: FakeClock) -> None:
    """A failed trial opens the circuit again, and the cool-down starts over."""
    breaker = opened(clock, threshold=3, cooldown_s=30)
    clock.advance(30)
    breaker.before_call()
    breaker.record_failure()
    assert breaker.state == "open"
    clock.advance(29)
    with pytest.raises(errors.UpstreamUnavailable, match="opened after 4 consecutive failures; retrying in 1 s"):
        breaker.before_call()
    clock.advance(1)
    breaker.before_call()
    assert breaker.state == "half_open"


def test_one_failure_in_half_open_reopens_whatever_the_threshold(clock: FakeClock) -> None:
    """In half-open a single failure is enough to open again."""
    breaker = opened(clock, threshold=5, cooldown_s=10)
    clock.advance(10)
    breaker.before_call()
    breaker.record_failure()
    with pytest.raises(errors.UpstreamUnavailable):
        breaker.before_call()


def test_late_failures_do_not_extend_the_cooldown(clock: FakeClock) -> None:
    """Calls sent before the circuit opened and failing afterwards leave the cool-down as it was."""
    breaker = opened(clock, cooldown_s=30)
    clock.advance(20)
    for _ in range(50):
        breaker.record_failure()
    clock.advance(10)
    breaker.before_call()
    assert breaker.state == "half_open"


def test_lost_trial_is_given_up_after_a_cooldown(clock: FakeClock) -> None:
    """A trial that never reports back (cancelled) does not block the upstream forever."""
    breaker = opened(clock, cooldown_s=30)
    clock.advance(30)
    breaker.before_call()
    clock.advance(29)
    with pytest.raises(errors.UpstreamUnavailable):
        breaker.before_call()
    clock.advance(1)
    breaker.before_call()
    assert breaker.state == "half_open"


def test_zero_cooldown_goes_straight_to_half_open(clock: FakeClock) -> None:
    """With no cool-down an open circuit lets the next call through as its trial."""
    breaker = opened(clock, cooldown_s=0)
    breaker.before_call()
    assert breaker.state == "half_open"


@pytest.mark.parametrize(("threshold", "cooldown_s"), [(0, 30), (-1, 30), (3, -1)])
def test_invalid_configuration(threshold: int, cooldown_s: float) -> None:
    """A threshold under 1 or a negative cool-down is refused."""
    with pytest.raises(ValueError):
        CircuitBreaker(threshold, cooldown_s)


def test_breakers_are_per_upstream(clock: FakeClock) -> None:
    """Each upstream has its own breaker; one opening leaves the others closed."""
    breakers = Breakers(clock)
    failing = breakers.get("a", threshold=2, cooldown_s=5)
    failing.record_failure()
    failing.record_failure()
    assert breakers.get("a", threshold=2, cooldown_s=5) is failing
    breakers.get("b", threshold=2, cooldown_s=5).before_call()
    assert (failing.state, breakers.get("b", threshold=2, cooldown_s=5).state) == ("open", "closed")
    clock.advance(5)
    assert failing.state == "half_open"


def test_breakers_use_the_registry_clock_and_name(clock: FakeClock) -> None:
    """A registry's breakers read its clock and name their upstream in messages."""
    breaker = Breakers(clock).get("crm", threshold=1, cooldown_s=60)
    breaker.record_failure()
    clock.advance(15)
    with pytest.raises(errors.UpstreamUnavailable, match=r"'crm' is unavailable.*retrying in 45 s"):
        breaker.before_call()


def test_changed_configuration_starts_a_fresh_breaker(clock: FakeClock) -> None:
    """Reloaded definitions with another threshold or cool-down get a new, closed breaker."""
    breakers = Breakers(clock)
    old = breakers.get("a", threshold=1, cooldown_s=30)
    old.record_failure()
    new = breakers.get("a", threshold=3, cooldown_s=30)
    assert new is not old and new.state == "closed"
