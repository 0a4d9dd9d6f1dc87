"""What the console's fleet chart and `toolworker top` draw: the activity slots of every shard (activity.py) and
the oldest waiting call's age, sampled at most every SAMPLE_S seconds while someone watches and kept in
memory for the window (an age is a reading of now: the history starts with the first look)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from worker.constants import DEFAULT_QUEUE, ROUTES_KEY
from worker.queue import activity
from worker.queue.activity import Point
from worker.queue.ages import AgeReader

SAMPLE_S = 2.0
MAX_SERIES = 24  # the busiest queues and tenants drawn; the table lists them all


@dataclass(frozen=True)
class Series:
    """One queue and tenant: the activity slots and the sampled ages (time, seconds) of the window."""

    queue: str
    tenant: str
    points: list[Point]
    ages: list[tuple[float, float]]

    @property
    def now(self) -> dict[str, float | None]:
        """The latest figures, as the caption and the element's data attributes give them."""
        last = self.points[-1] if self.points else None
        return {
            "ok_per_s": last.ok_per_s if last else 0.0,
            "failed_per_s": last.failed_per_s if last else 0.0,
            "p50_s": last.p50_s if last else None,
            "p99_s": last.p99_s if last else None,
            "oldest_waiting_s": self.ages[-1][1] if self.ages else None,
        }


class Watch:
    """The figures of the last WINDOW_S seconds, per queue and tenant, over every shard (the home one first)."""

    def __init__(self, clients: Sequence[redis.Redis], window_s: int = activity.WINDOW_S) -> None:
        self._clients = list(clients)
        self._readers = [AgeReader(client) for client in self._clients]
        self.window_s = window_s
        self._ages: deque[tuple[float, dict[tuple[str, str], float]]] = deque()
        self._lock = threading.Lock()

    def series(self) -> list[Series]:
        """Sample the ages when the last sample is older than SAMPLE_S, then every series worth drawing."""
        now = time.time()
        with self._lock:
            if not self._ages or now - self._ages[-1][0] >= SAMPLE_S:
                self._ages.append((now, self._sample()))
            while self._ages and self._ages[0][0] < now - self.window_s:
                self._ages.popleft()
            ages = list(self._ages)
        slots = activity.read(self._clients, self.window_s, now)
        keys = set(slots) | {key for _, sample in ages for key, age in sample.items() if age > 0}
        drawn = [
            Series(queue, tenant, slots.get((queue, tenant), []), [(t, s.get((queue, tenant), 0.0)) for t, s in ages])
            for queue, tenant in keys
        ]
        drawn.sort(key=_busy, reverse=True)
        return sorted(drawn[:MAX_SERIES], key=lambda s: (s.queue, s.tenant))

    def _sample(self) -> dict[tuple[str, str], float]:
        queues = _queues(self._clients[0])
        sample: dict[tuple[str, str], float] = {}
        for reader in self._readers:
            for age in reader.read(queues):
                key = (age.queue, age.tenant)
                sample[key] = max(sample.get(key, 0.0), age.waiting_s or 0.0)
        return sample


def _queues(home: redis.Redis) -> list[str]:
    routed: Any = home.hvals(ROUTES_KEY)
    return sorted({DEFAULT_QUEUE, *(q.decode() for q in routed)})


def _busy(series: Series) -> float:
    calls = sum(p.ok_per_s + p.failed_per_s for p in series.points)
    return calls + max((age for _, age in series.ages), default=0.0)
