"""What the fleet did, second by second: calls answered (ok / failed) and their durations, per queue and tenant,
kept in Redis for the console's chart and `toolworker top`.

    toolworker:activity:<slot>   HASH "<queue>\\t<tenant>\\t<field>" -> count, one per SLOT_S seconds (the
                                 slot's start, Unix seconds), kept KEEP_S; fields: `ok`, `failed` and `b<i>`,
                                 the calls whose duration fell in DURATION_BUCKETS_S[i] (the last: above all)

Each worker process counts in memory (`observe`, no I/O on the call's path) and a thread of its own adds
its counts to the slots once a second (one pipeline), on the shard the process serves. Prometheus has the
same figures per worker (worker/metrics.py); these are fleet-wide and need no Prometheus to be read. A
reader (`read`) sums the slots of every shard and gives per queue and tenant one point per finished
slot: calls per second and the p50 and p99 duration, interpolated within the buckets as Prometheus's
histogram_quantile does. A flush that fails is logged and its counts dropped: figures never hold up a call.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import structlog

from worker.metrics import DURATION_BUCKETS_S

log = structlog.get_logger("toolworker.activity")

PREFIX = "toolworker:activity:"
SLOT_S = 2
KEEP_S = 900
FLUSH_S = 1.0
WINDOW_S = 300  # what the console and `top` show
_BOUNDS = (*DURATION_BUCKETS_S, float("inf"))


def slot_of(at_s: float) -> int:
    return int(at_s // SLOT_S) * SLOT_S


def bucket_of(duration_s: float) -> int:
    """The first bucket whose bound is at least the duration."""
    return bisect_left(_BOUNDS, duration_s)


class Recorder:
    """One process's counts since its last flush, and the thread that adds them to Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._counts: Counter[tuple[int, str]] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolworker-activity", daemon=True)

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def observe(self, queue: str, tenant: str, ok: bool, duration_s: float, at_s: float | None = None) -> None:
        slot, where = slot_of(time.time() if at_s is None else at_s), f"{queue}\t{tenant}\t"
        with self._lock:
            self._counts[slot, where + ("ok" if ok else "failed")] += 1
            self._counts[slot, where + f"b{bucket_of(duration_s)}"] += 1

    def flush(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        if not counts:
            return
        with self._client.pipeline(transaction=False) as pipe:
            for (slot, field), count in counts.items():
                pipe.hincrby(PREFIX + str(slot), field, count)
            for slot in {slot for slot, _ in counts}:
                pipe.expire(PREFIX + str(slot), KEEP_S)
            pipe.execute()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            try:
                self.flush()
            except (redis.RedisError, OSError) as exc:
                log.warning("activity.flush_failed", error=str(exc))


_recorder: tuple[int, Recorder] | None = None
_recorder_lock = threading.Lock()


def observe(queue: str, tenant: str, ok: bool, duration_s: float) -> None:
    """Count one answered call in this process (a recorder per process: a pool child starts its own)."""
    global _recorder
    if _recorder is None or _recorder[0] != os.getpid():
        with _recorder_lock:
            if _recorder is None or _recorder[0] != os.getpid():
                _recorder = (os.getpid(), Recorder(_client()).start())
    _recorder[1].observe(queue, tenant, ok, duration_s)


def _client() -> redis.Redis:
    from worker.connections import sync_client
    from worker.settings import get_settings

    return sync_client(get_settings().queue_url, socket_timeout=2.0, socket_connect_timeout=2.0)


@dataclass(frozen=True)
class Point:
    """One finished slot of one queue and tenant."""

    at_s: int  # the slot's start
    ok_per_s: float
    failed_per_s: float
    p50_s: float | None  # None: no call in the slot
    p99_s: float | None


def read(
    clients: Sequence[redis.Redis], window_s: int = WINDOW_S, now_s: float | None = None
) -> dict[tuple[str, str], list[Point]]:
    """The finished slots of the last `window_s`, summed over the shards, per queue and tenant that had calls."""
    end = slot_of(time.time() if now_s is None else now_s)  # the slot under way is left out
    slots = list(range(end - window_s, end, SLOT_S))
    totals: list[Counter[str]] = [Counter() for _ in slots]
    for client in clients:
        with client.pipeline(transaction=False) as pipe:
            for slot in slots:
                pipe.hgetall(PREFIX + str(slot))
            for total, table in zip(totals, pipe.execute(), strict=True):
                total.update({_text(k): int(v) for k, v in table.items()})
    series: dict[tuple[str, str], list[Point]] = {}
    for key in sorted({tuple(f.split("\t")[:2]) for total in totals for f in total}):
        queue, tenant = key
        series[(queue, tenant)] = [
            _point(slot, total, f"{queue}\t{tenant}\t") for slot, total in zip(slots, totals, strict=True)
        ]
    return series


def _point(slot: int, total: Counter[str], where: str) -> Point:
    buckets = [total[f"{where}b{i}"] for i in range(len(_BOUNDS))]
    return Point(
        slot,
        total[where + "ok"] / SLOT_S,
        total[where + "failed"] / SLOT_S,
        quantile(0.5, buckets),
        quantile(0.99, buckets),
    )


def quantile(q: float, buckets: Sequence[int]) -> float | None:
    """The q-quantile of counts per bucket of _BOUNDS, linear within a bucket (the last: its lower bound)."""
    count = sum(buckets)
    if count == 0:
        return None
    rank, below = q * count, 0
    for i, n in enumerate(buckets):
        if below + n >= rank and n:
            lower = _BOUNDS[i - 1] if i else 0.0
            upper = _BOUNDS[i]
            return lower if upper == float("inf") else lower + (upper - lower) * (rank - below) / n
        below += n
    return _BOUNDS[-2]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
