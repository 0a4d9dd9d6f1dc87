"""Leases: which live worker process holds which messages, so that a dead one's come back in seconds.

    take       <queue list> -> toolworker:inflight:<holder>:<queue list>, in the fair take's script (one
               atomic step: no message is ever only in a process's memory)
    hold       SET toolworker:lease:<holder> EX lease_s, renewed every lease_s / 5 by a thread of its own
    ack        LREM it from the holder's in-flight list (and kombu's unacked records, as before)
    reconcile  the holder itself, after a reconnect or a failed ack: an entry it does not hold goes back
               to its queue (a take whose reply was lost), one it settled is removed (an ack that was lost)
    recover    any live worker, every few seconds: a holder in toolworker:holders without a lease is dead;
               its in-flight messages go back to their queues, marked redelivered (so the done-key
               check applies), in one transaction that a renewed lease aborts

A failover is not a crash. Lease keys replicate with their expiry as a point in time, so after an outage
longer than a lease the promoted replica holds no live worker's lease either, and whoever swept first
would hand every call in flight out to run a second time. So leases are judged only on a primary that
has been one for a while, by its own clock: each renewal reads the primary's replication ID (new at every
promotion) and TIME, and the first holder to see a promoted one records when in
toolworker:lease-primaries; no one sweeps until a grace (a lease plus two Redis timeouts) has
passed since then. Every live holder renews within that time: it tries every lease_s / 5, each try
bounded by the timeout, and finds the new primary through the Sentinels by itself. A worker started
after the failover reads the same record, so it waits out the same grace. Besides, a holder whose own
renewal failed sweeps for no one for a grace after that (its view of the others is stale, whatever the
primary). A holder that stays away longer than the grace is taken for dead, as before.

A take whose reply is lost with the connection (the server applied it, then crashed; a failover kept it)
leaves a message in a live holder's in-flight list that the holder never received, and a consumer that
restarts on a lost connection drops what it had received but not started without being able to put it
back. For a while after losing Redis, a holder looks at its own lists and puts back what the process is
not working on (`in_use`: Celery's received and running requests), once it is seen so twice in a row
(a take being handed over at that moment is in use at the second look).

A holder is a worker process, not a broker channel: a channel that reconnects keeps its messages, and
they are acknowledged on the new connection. A call that runs for an hour under a live holder is never
handed out again; the visibility timeout stays only as a last resort, far above any call.

This module owns its Redis keys (LEASE_PREFIX, INFLIGHT_PREFIX, HOLDERS_KEY, PRIMARIES_KEY).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis
import structlog

from worker.queue import scheduler

log = structlog.get_logger("toolworker.leases")

LEASE_PREFIX = "toolworker:lease:"
INFLIGHT_PREFIX = "toolworker:inflight:"
HOLDERS_KEY = "toolworker:holders"
# Replication ID of a primary -> the primary's own time (s) when a holder first renewed on it.
PRIMARIES_KEY = "toolworker:lease-primaries"
_PRIMARIES_TTL_S = 7 * 86_400
# KEYS: an in-flight list, its queue. ARGV: the message as taken, as put back, 1 for the consumer's end.
_PUT_BACK = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if ARGV[3] == '1' then redis.call('LPUSH', KEYS[2], ARGV[2]) else redis.call('RPUSH', KEYS[2], ARGV[2]) end
return 1
"""
_REQUEUED = 2  # _SETTLE's answer for an entry put back on its queue (1: removed only, 0: not there)
_RENEWALS_PER_LEASE = 5
_REDIS_TIMEOUT_S = 2.0


# Removes one in-flight entry and, if it was there and ARGV[2] is '1', puts it back at the head of its queue
# (where the next take finds it) as ARGV[4], marked redelivered (it may have run: an acknowledgement the
# promoted replica never got leaves it here, and the done-key check must apply); with ARGV[3], the delivery
# tag, kombu's unacked records of it go too. KEYS: the in-flight list, the queue, kombu's unacked hash and
# index. ARGV[1]: the entry.
_SETTLE = """
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if ARGV[3] ~= '' then
  redis.call('HDEL', KEYS[3], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
end
if removed == 1 and ARGV[2] == '1' then
  redis.call('RPUSH', KEYS[2], ARGV[4])
  return 2
end
return removed
"""


def inflight_key(holder: str, queue_key: str) -> str:
    return f"{INFLIGHT_PREFIX}{holder}:{queue_key}"


def redelivered(raw: bytes) -> bytes | str:
    """A message taken back from a dead holder, marked as kombu marks what it restores (a message that is
    not a JSON object goes back as it was: the consumer dead-letters it)."""
    try:
        payload = json.loads(raw)
        payload.setdefault("headers", {})["redelivered"] = True
        payload.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = True
    except (ValueError, AttributeError, TypeError):
        return raw
    return json.dumps(payload)


def delivery_tag(raw: bytes) -> str | None:
    try:
        tag = json.loads(raw)["properties"]["delivery_tag"]
    except (ValueError, KeyError, TypeError):
        return None
    return tag if isinstance(tag, str) else None


class Leases:
    """This process's lease (one holder per process), and the sweep for the holders that died."""

    def __init__(
        self,
        client: redis.Redis,
        lease_s: float,
        unacked_key: str,
        unacked_index_key: str,
    ) -> None:
        self.client = client
        self.lease_s = lease_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._unacked_keys = (unacked_key, unacked_index_key)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.grace_s = lease_s + 2 * _REDIS_TIMEOUT_S
        self._quiet_until = 0.0  # after losing Redis, others get the grace to renew before a sweep
        self._primary: tuple[str, float] = ("", 0.0)  # replication ID of the primary, since when (its clock)
        self._primary_age_s = 0.0
        self._renewed = False

    def start(self) -> None:
        self.renew()
        self._thread = threading.Thread(target=self._run, name="toolworker-leases", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """The lease renewed; the primary's age by its own clock, read (TIME) only while it may matter: a
        primary never promoted needs none (as at the last renewal, the usual case: one command less)."""
        timed = self._primary_age_s != float("inf") or not self._renewed
        with self.client.pipeline(transaction=False) as pipe:
            pipe.set(LEASE_PREFIX + self.holder, "1", px=int(self.lease_s * 1000))
            pipe.sadd(HOLDERS_KEY, self.holder)
            pipe.info("replication")
            if timed:
                pipe.time()
            replies = pipe.execute()
        self._renewed = True
        info = replies[2]
        if int(info.get("second_repl_offset", -1)) < 0:  # never promoted: no failover to wait out
            self._primary_age_s = float("inf")
            return
        seconds, micros = replies[3] if timed else self.client.time()  # promoted since the last renewal
        now_s = seconds + micros / 1e6
        self._primary_age_s = now_s - self._primary_since(str(info.get("master_replid")), now_s)

    def _primary_since(self, replid: str, now_s: float) -> float:
        """Since when (by its clock) this primary has been one: recorded by the first holder to renew on it."""
        if replid != self._primary[0]:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hsetnx(PRIMARIES_KEY, replid, repr(now_s))
                pipe.hget(PRIMARIES_KEY, replid)
                pipe.expire(PRIMARIES_KEY, _PRIMARIES_TTL_S)
                _, since, _ = pipe.execute()
            self._primary = (replid, float(since))
            log.info("lease.primary_seen", replid=replid, age_s=round(now_s - float(since), 3))
        return self._primary[1]

    def may_sweep(self) -> bool:
        """Only on a primary older than the grace, and not within the grace after losing Redis ourselves."""
        return self._primary_age_s >= self.grace_s and time.monotonic() >= self._quiet_until

    def tick(self) -> None:
        """One renewal, and a sweep when leases can be judged."""
        self.renew()
        if self.may_sweep():
            self.sweep()

    def put_back(self, inflight: str, raw: bytes, leftmost: bool = False) -> int:
        """Move one message of our in-flight list `inflight` back to its queue, marked redelivered."""
        queue_key = inflight[len(inflight_key(self.holder, "")) :]
        moved: Any = self.client.eval(_PUT_BACK, 2, inflight, queue_key, raw, redelivered(raw), int(leftmost))
        if moved:  # its tenant has work again, and the calls wait instead of running
            with self.client.pipeline(transaction=True) as pipe:
                scheduler.requeued(pipe, queue_key, raw)
                pipe.execute()
        return int(moved)

    def release(self) -> None:
        """Give the lease up and hand back at once whatever is still held (a process that exits, after
        kombu has put back the messages it delivered)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(_REDIS_TIMEOUT_S * 2)
        try:
            self.client.delete(LEASE_PREFIX + self.holder)
            self.recover(self.holder)
        except redis.RedisError as exc:
            log.warning("lease.release_failed", error=str(exc))

    def _run(self) -> None:
        interval_s = self.lease_s / _RENEWALS_PER_LEASE
        while not self._stop.wait(interval_s):
            try:
                self.tick()
            except redis.RedisError as exc:
                self._quiet_until = time.monotonic() + self.grace_s
                log.warning("lease.renew_failed", error=str(exc))

    def sweep(self) -> int:
        """Hand the messages of every holder without a lease back to their queues; how many went back."""
        moved = 0
        for raw_holder in self.client.smembers(HOLDERS_KEY):
            holder = raw_holder.decode() if isinstance(raw_holder, bytes) else str(raw_holder)
            if holder != self.holder and not self.client.exists(LEASE_PREFIX + holder):
                moved += self.recover(holder)
        return moved

    def recover(self, holder: str) -> int:
        """Requeue a dead holder's in-flight messages, unless its lease is renewed meanwhile."""
        prefix = f"{INFLIGHT_PREFIX}{holder}:"
        moved = 0
        for key in self.client.scan_iter(match=prefix + "*", count=100):
            name = key.decode() if isinstance(key, bytes) else str(key)
            requeue: Any = self._requeue(holder, name, name[len(prefix) :])
            requeued: Any = self.client.transaction(requeue, LEASE_PREFIX + holder, name, value_from_callable=True)
            moved += int(requeued)
        self.client.srem(HOLDERS_KEY, holder)  # a holder that comes back adds itself again
        if moved:
            log.warning("lease.recovered", holder=holder, messages=moved)
        return moved

    def reconcile(self, held: Callable[[], tuple[set[bytes], set[bytes]]]) -> int:
        """Make this holder's in-flight lists what the process holds; how many entries went back to their
        queues. `held()` gives the messages held and those settled; it is read after the lists, so that an
        entry acknowledged meanwhile (removed from its list before it leaves the holdings) is never requeued."""
        prefix = inflight_key(self.holder, "")
        lists: dict[str, list[bytes]] = {}
        for key in self.client.scan_iter(match=prefix + "*", count=100):
            name = key.decode() if isinstance(key, bytes) else str(key)
            lists[name] = cast("list[bytes]", self.client.lrange(name, 0, -1))  # a sync client's reply
        holding, settled = held()
        settle = self.client.register_script(_SETTLE)
        requeued = 0
        for name, items in lists.items():
            for raw in items:
                if raw in holding:
                    continue
                tag = delivery_tag(raw) if raw in settled else None
                source = name[len(prefix) :]
                keys = [name, source, *self._unacked_keys]
                args = [raw, "0" if raw in settled else "1", tag or "", redelivered(raw)]
                outcome = int(settle(keys=keys, args=args))
                self._settled_for_tenant(source, raw, outcome)
                requeued += outcome == _REQUEUED
        return requeued

    def _settled_for_tenant(self, source: str, raw: bytes, outcome: int) -> None:
        """The tenant's counts after a reconcile: calls back in their queue wait again; calls whose
        settlement Redis missed (the release went with it) are no longer running."""
        if outcome == 0:
            return
        with self.client.pipeline(transaction=True) as pipe:
            if outcome == _REQUEUED:
                scheduler.requeued(pipe, source, raw)
            else:
                scheduler.release(pipe, source, raw)
            pipe.execute()

    def _requeue(self, holder: str, inflight: str, queue_key: str) -> Callable[[Any], int]:
        unacked, unacked_index = self._unacked_keys

        def requeue(pipe: Any) -> int:
            if pipe.exists(LEASE_PREFIX + holder):
                return 0
            items = pipe.lrange(inflight, 0, -1)
            pipe.multi()
            for raw in reversed(items):  # the oldest first; BLMOVE pushed each new one to the head
                tag = delivery_tag(raw)
                if tag is not None:
                    pipe.hdel(unacked, tag)
                    pipe.zrem(unacked_index, tag)
                pipe.rpush(queue_key, redelivered(raw))
                scheduler.requeued(pipe, queue_key, raw)
            pipe.delete(inflight)
            return len(items)

        return requeue
