"""Per-upstream circuit breakers: stop calling an upstream that keeps failing, try it again after a pause.

    closed ──N consecutive failures──▶ open ──cool-down passed──▶ half_open (one trial call at a time)
       ▲                                 ▲                            │
       └───────────── trial succeeded ───┼────────────────────────────┤
                                         └──── trial failed ──────────┘

State lives in one worker process and is touched from its one event loop only, so no lock is needed.
A failure is a transport failure or a 5xx answer; the caller decides which outcome is which.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from worker import errors
from worker.constants import DEFAULT_CIRCUIT_COOLDOWN_S, DEFAULT_CIRCUIT_THRESHOLD

Clock = Callable[[], float]
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(
        self,
        threshold: int = DEFAULT_CIRCUIT_THRESHOLD,
        cooldown_s: float = DEFAULT_CIRCUIT_COOLDOWN_S,
        clock: Clock = time.monotonic,
        *,
        name: str = "upstream",
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be at least 1")
        if cooldown_s < 0:
            raise ValueError("cooldown_s must not be negative")
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.name = name
        self._clock = clock
        self._state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        # When the half-open trial call started; None while no trial is out.
        self._trial_started_at: float | None = None

    @property
    def state(self) -> str:
        """ "closed", "open" or "half_open" (an open circuit whose cool-down has passed is half-open)."""
        if self._state == OPEN and self._cooled_down():
            return HALF_OPEN
        return self._state

    def before_call(self) -> None:
        """Let a call through, or raise UpstreamUnavailable (exit 69) with when to try again."""
        if self._state == CLOSED:
            return
        if self._state == OPEN and not self._cooled_down():
            raise self._unavailable(self._opened_at + self.cooldown_s - self._clock())
        if self._trial_out():
            raise self._unavailable(0.0, trial=True)
        self._state = HALF_OPEN
        self._trial_started_at = self._clock()

    def record_success(self) -> None:
        """The upstream answered: close the circuit and forget past failures."""
        self._state = CLOSED
        self._failures = 0
        self._trial_started_at = None

    def record_failure(self) -> None:
        """A transport failure or a 5xx: count it; open at the threshold, or again after a failed trial."""
        if self._state == OPEN:
            return  # late failures of calls sent before it opened must not extend the cool-down
        self._failures += 1
        if self._state == HALF_OPEN or self._failures >= self.threshold:
            self._open()

    def _open(self) -> None:
        self._state = OPEN
        self._opened_at = self._clock()
        self._trial_started_at = None

    def _cooled_down(self) -> bool:
        return self._clock() - self._opened_at >= self.cooldown_s

    def _trial_out(self) -> bool:
        """A trial call is in flight; one that never reported back is given up after a cool-down."""
        if self._state != HALF_OPEN or self._trial_started_at is None:
            return False
        return self._clock() - self._trial_started_at < self.cooldown_s

    def _unavailable(self, wait_s: float, trial: bool = False) -> errors.UpstreamUnavailable:
        if trial:
            why = "a trial call is checking whether it has recovered; try again in a few seconds"
        else:
            seconds = max(1, math.ceil(wait_s))
            why = f"its circuit opened after {self._failures} consecutive failures; retrying in {seconds} s"
        return errors.UpstreamUnavailable(f"The upstream {self.name!r} is unavailable: {why}. The call was not sent.")


class Breakers:
    """The circuit breakers of one worker process, one per upstream name, made on first use."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(
        self, upstream: str, threshold: int = DEFAULT_CIRCUIT_THRESHOLD, cooldown_s: float = DEFAULT_CIRCUIT_COOLDOWN_S
    ) -> CircuitBreaker:
        """The upstream's breaker; a changed configuration starts a fresh (closed) one."""
        breaker = self._breakers.get(upstream)
        if breaker is None or (breaker.threshold, breaker.cooldown_s) != (threshold, cooldown_s):
            breaker = self._breakers[upstream] = CircuitBreaker(threshold, cooldown_s, self._clock, name=upstream)
        return breaker
