"""How long calls wait: the age of the oldest waiting call and of the oldest running one, per queue and tenant.

    toolworker_queue_oldest_age_seconds{queue,tenant}          the oldest call waiting (0: none waits)
    toolworker_queue_oldest_running_age_seconds{queue,tenant}  the oldest call taken and not yet answered,
                                                               counted from its enqueue as well

Read without walking a list: every list is pushed at its head and taken from its tail, so its oldest message
is its last element. One pipeline reads who there is (the rings, the listed tenants, the in-flight counts,
the live holders), then one script returns the oldest message of every list (`LRANGE -2 -1` each, O(1); two
so that a wake-up item at the tail is stepped over): a queue's default-tenant lists (one per priority), each
tenant's list (the ring's, the listed ones), and for running calls the in-flight lists of each live holder,
for the tenants the in-flight count says have calls running: two round trips per read, whatever the counts.
A message says when it was enqueued in a header of its own (ENQUEUED_HEADER, which the client's messages
carry: read with a regular expression, the body is not decoded), else in its call's `enqueuedAt` (a stock
Celery producer may set it; the body is decoded); one that says neither is aged from the first read that
saw it at the head of the line, a lower bound, remembered per reader.

Each read asks Redis afresh (a scrape is never stale); the figures are fleet-wide, as depth.py's are:
aggregate them with max(). The tenant label folds unlisted tenants into `other`, as depth.py does.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.constants import DEFAULT_TENANT, ENQUEUED_HEADER, TENANT_LIMITS_KEY
from worker.queue import scheduler
from worker.queue.leases import HOLDERS_KEY, inflight_key

log = structlog.get_logger("toolworker.metrics")
OTHER_TENANTS = "other"
_ENQUEUED_RE = re.compile(rb'"' + re.escape(ENQUEUED_HEADER.encode()) + rb'": (\d+)')
# KEYS: lists; ARGV[1]: the wake-up item. The last element of each list that is not a wake-up item (one may
# sit at the tail of a queue's own list), false for none: LRANGE -2 -1 is O(1) at the tail.
_OLDEST = """
local found = {}
for i, key in ipairs(KEYS) do
  local tail = redis.call('LRANGE', key, -2, -1)
  found[i] = false
  for j = #tail, 1, -1 do
    if tail[j] ~= ARGV[1] then found[i] = tail[j]; break end
  end
end
return found
"""
_KEYS_PER_SCRIPT = 2000  # a script's reply stays small; a longer list of lists takes several


@dataclass(frozen=True)
class Age:
    """The oldest waiting and running call of one tenant on one queue, in seconds (None: there is none)."""

    queue: str
    tenant: str
    waiting_s: float | None
    running_s: float | None


def enqueued_at(raw: bytes) -> float | None:
    """When the message was enqueued, as a Unix time: its ENQUEUED_HEADER, else its (first) call's
    `enqueuedAt` (a stock producer may set it); None when it says neither."""
    stamped = _ENQUEUED_RE.search(raw)  # unescaped quotes: the message's own headers, never the body's text
    if stamped:
        return int(stamped.group(1)) / 1000
    try:
        message = json.loads(raw)
        body: Any = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        call = json.loads(body)[0][0]
        if isinstance(call, list):  # a batch: its first call is its oldest
            call = call[0]
        return datetime.fromisoformat(call["enqueuedAt"]).timestamp()
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


class AgeReader:
    """Reads the ages; remembers when it first saw each unstamped message at the head of a line."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._first_seen: dict[bytes, float] = {}
        self.listed: set[str] = {DEFAULT_TENANT}  # the tenants the definitions name, as of the last read

    def read(self, queues: Sequence[str]) -> list[Age]:
        """One row per queue and tenant that has a list: the default tenant, the ring's, the listed ones."""
        now = time.time()
        tenants, running, holders = self._who(queues)
        waiting_keys = {(q, t): scheduler_lists(q, t) for q in queues for t in tenants[q]}
        running_keys = {
            (q, t): [inflight_key(h, key) for h in holders for key in scheduler_lists(q, t)]
            for q in queues
            for t in running
        }
        tails = self._tails([*_flat(waiting_keys), *_flat(running_keys)])
        seen: dict[bytes, float] = {}
        rows = []
        for queue in queues:
            for tenant in sorted(tenants[queue] | running):
                waiting = self._oldest(waiting_keys.get((queue, tenant), []), tails, now, seen)
                in_flight = self._oldest(running_keys.get((queue, tenant), []), tails, now, seen)
                rows.append(Age(queue, tenant, waiting, in_flight))
        self._first_seen = seen
        return rows

    def _who(self, queues: Sequence[str]) -> tuple[dict[str, set[str]], set[str], list[str]]:
        """Per queue the tenants that may have calls waiting; the tenants with calls running; the holders."""
        with self._client.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.zrange(scheduler.RING_PREFIX + queue, 0, -1)
            pipe.hkeys(TENANT_LIMITS_KEY)
            pipe.hgetall(scheduler.IN_FLIGHT_KEY)
            pipe.smembers(HOLDERS_KEY)
            replies = pipe.execute()
        rings, listed_raw, flying, holders = replies[: len(queues)], *replies[len(queues) :]
        listed = self.listed = {_text(name) for name in listed_raw} | {DEFAULT_TENANT}
        tenants = {q: listed | {_text(name) for name in ring} for q, ring in zip(queues, rings, strict=True)}
        running = {_text(name) for name, count in flying.items() if int(count) > 0}
        return tenants, running, sorted(_text(h) for h in holders)

    def _tails(self, keys: list[str]) -> dict[str, bytes | None]:
        """The oldest message of each list, in one script (one round trip, however many lists)."""
        found: list[bytes | None] = []
        for start in range(0, len(keys), _KEYS_PER_SCRIPT):
            chunk = keys[start : start + _KEYS_PER_SCRIPT]
            replies: Any = self._client.eval(_OLDEST, len(chunk), *chunk, scheduler.WAKE)
            found += replies or []
        return {key: raw or None for key, raw in zip(keys, found, strict=True)}

    def _oldest(
        self, keys: list[str], tails: dict[str, bytes | None], now: float, seen: dict[bytes, float]
    ) -> float | None:
        ages = [self._age(raw, now, seen) for key in keys if (raw := tails[key]) is not None]
        return max(ages) if ages else None

    def _age(self, raw: bytes, now: float, seen: dict[bytes, float]) -> float:
        stamp = enqueued_at(raw)
        if stamp is None:
            digest = hashlib.sha1(raw).digest()
            stamp = seen[digest] = self._first_seen.get(digest, now)
        return max(0.0, now - stamp)


def with_ages(rows: list[dict[str, Any]], found: list[Age]) -> list[dict[str, Any]]:
    """`toolworker queue`'s rows with each tenant's oldest ages (None: no call), and a row for a tenant that
    has calls running on a queue and none waiting there."""
    by_key = {(age.queue, age.tenant): age for age in found}
    known = {(row["queue"], row["tenant"]) for row in rows}
    extra = [
        {"queue": age.queue, "tenant": age.tenant, "waiting": 0, "queued": 0, "in_flight": 0}
        for age in found
        if (age.queue, age.tenant) not in known and age.running_s is not None
    ]
    return [
        row
        | {
            "oldest_waiting_s": _rounded(age.waiting_s if age else None),
            "oldest_running_s": _rounded(age.running_s if age else None),
        }
        for row in rows + extra
        for age in [by_key.get((row["queue"], row["tenant"]))]
    ]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def scheduler_lists(queue: str, tenant: str) -> list[str]:
    """A tenant's lists of a queue: the default tenant's one per priority, a named tenant's one."""
    if tenant == DEFAULT_TENANT:
        return [queue + suffix for suffix in scheduler.PRIORITY_SUFFIXES]
    return [scheduler.tenant_list(queue, tenant)]


def _flat(keys: dict[tuple[str, str], list[str]]) -> Iterator[str]:
    for group in keys.values():
        yield from group


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class QueueAges(Collector):
    """The two age gauges of the queues a worker serves, read at each scrape from every shard given (with
    shards, a tenant's calls are on its shard: the oldest of them all); a shard that does not answer is left
    out of the scrape, not the whole of it."""

    def __init__(self, clients: redis.Redis | Sequence[redis.Redis], queues: Sequence[str]) -> None:
        shards = [clients] if isinstance(clients, redis.Redis) else list(clients)
        self._readers = [AgeReader(client) for client in shards]
        self._queues = tuple(queues)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(_families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting, running = _families()
        rows: list[Age] = []
        listed: set[str] = set()
        for reader in self._readers:
            try:
                rows += reader.read(self._queues)
            except redis.RedisError as exc:  # a scrape without them beats a failed scrape
                log.warning("metrics.queue_ages_failed", error=str(exc))
                continue
            listed |= reader.listed
        if not listed:
            return
        for family, ages in (
            (waiting, folded(rows, listed, "waiting_s")),
            (running, folded(rows, listed, "running_s")),
        ):
            for (queue, tenant), age in sorted(ages.items()):
                family.add_metric([queue, tenant], age)
        yield from (waiting, running)


def folded(rows: list[Age], listed: set[str], field: str) -> dict[tuple[str, str], float]:
    """Per queue and tenant label (unlisted tenants under `other`): the oldest age, 0 when there is none."""
    ages: dict[tuple[str, str], float] = {}
    for row in rows:
        key = (row.queue, row.tenant if row.tenant in listed else OTHER_TENANTS)
        value: float | None = getattr(row, field)
        ages[key] = max(ages.get(key, 0.0), value or 0.0)
    return ages


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    labels = ["queue", "tenant"]
    waiting = GaugeMetricFamily(
        "toolworker_queue_oldest_age_seconds", "Age of the oldest call waiting, per queue and tenant.", labels=labels
    )
    running = GaugeMetricFamily(
        "toolworker_queue_oldest_running_age_seconds",
        "Age (since its enqueue) of the oldest call taken and not yet answered, per queue and tenant.",
        labels=labels,
    )
    return waiting, running
