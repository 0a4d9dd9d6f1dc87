"""What a worker process holds of the queue, by its own account, and its lease on what it took.

One of each per process (a forked child starts its own): the broker's channels (broker.py) record there
every message they deliver and settle, and the worker pool (pool.py) marks the ones it runs. broker.py's
docstring tells why the account is kept and how the reconcile uses it.
"""

from __future__ import annotations

import atexit
import os
import threading

from kombu.transport import redis as kombu_redis

from worker.connections import sync_client
from worker.queue.leases import Leases
from worker.settings import get_settings

_leases: tuple[int, Leases] | None = None
_leases_lock = threading.Lock()


def process_leases(channel: kombu_redis.Channel) -> Leases:
    """The lease of this process, taken on its first message (and again in a forked child)."""
    global _leases
    with _leases_lock:
        if _leases is None or _leases[0] != os.getpid():
            settings = get_settings()
            client = sync_client(settings.queue_url, socket_timeout=2.0, socket_connect_timeout=2.0)
            leases = Leases(client, settings.lease_seconds, channel.unacked_key, channel.unacked_index_key)
            leases.start()
            atexit.register(leases.release)
            _leases = (os.getpid(), leases)
        return _leases[1]


class Holdings:
    """What this process holds, by its own account: the messages delivered and not yet settled (acknowledged,
    rejected or restored), and the settlements Redis may not have recorded. One per process, not per
    channel: after a reconnect the old channel acknowledges the calls it delivered, the new one takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delivered: dict[str, tuple[str, bytes]] = {}  # delivery tag -> (in-flight list, message)
        self._unconfirmed: set[tuple[str, bytes]] = set()  # settled here; Redis may still hold them
        self._untrusted: dict[tuple[str, bytes], None] = {}  # taken; the replicas did not confirm it: not run
        self._started: set[str] = set()  # delivered, and handed to the pool: it runs here, whatever the channel
        self.stale = False  # a settlement failed: reconcile before the next take

    def hold(self, tag: str, inflight: str, raw: bytes) -> None:
        with self._lock:
            self._delivered[tag] = (inflight, raw)

    def entry(self, tag: str) -> tuple[str, bytes] | None:
        with self._lock:
            return self._delivered.get(tag)

    def started(self, tag: str) -> None:
        """A delivered message handed to the worker pool: its call runs in this process from now on, and only
        its own acknowledgement or rejection settles it (a closing channel does not restore it)."""
        with self._lock:
            if tag in self._delivered:
                self._started.add(tag)

    def running(self, tag: str) -> bool:
        with self._lock:
            return tag in self._started

    def settled(self, tag: str, confirmed: bool) -> None:
        """Called after the settlement's removal from the in-flight list was sent, whether it succeeded."""
        with self._lock:
            entry = self._delivered.pop(tag, None)
            self._started.discard(tag)
            if entry is not None and not confirmed:
                self._unconfirmed.add(entry)
                self.stale = True

    def released(self, tag: str) -> None:
        """A message no longer held, though Redis may still hold it: taken but never handed on (Redis lost
        while kombu recorded it), or to go back to its queue by a restore or a reject that failed. The
        reconcile puts it back."""
        with self._lock:
            self._delivered.pop(tag, None)
            self._started.discard(tag)
            self.stale = True

    def unsure(self) -> None:
        """Messages may have been taken and never held (a take's delivery failed midway): the reconcile puts
        back what is not held before the next take."""
        with self._lock:
            self.stale = True

    def unconfirmed(self, inflight: str, raw: bytes) -> None:
        """A message this process dropped (never delivered) whose removal Redis may not have recorded."""
        with self._lock:
            self._unconfirmed.add((inflight, raw))
            self.stale = True

    def untrusted(self, inflight: str, raw: bytes) -> None:
        """A message taken whose take the replicas did not confirm (MIN_REPLICAS): held, not run, until the
        primary (the new one after a failover) says whether the take stands."""
        with self._lock:
            self._untrusted[(inflight, raw)] = None

    def next_untrusted(self) -> tuple[str, bytes] | None:
        with self._lock:
            return next(iter(self._untrusted), None)

    def decided(self, inflight: str, raw: bytes) -> None:
        """An untrusted take decided: it stands (it is delivered now) or it does not (the copy is dropped)."""
        with self._lock:
            self._untrusted.pop((inflight, raw), None)

    def snapshot(self) -> tuple[set[bytes], set[bytes]]:
        """The messages held (untrusted takes included), and those settled but perhaps still in an in-flight
        list."""
        with self._lock:
            held = {raw for _, raw in self._delivered.values()} | {raw for _, raw in self._untrusted}
            return held, {raw for _, raw in self._unconfirmed}

    def reconciled(self, settled: set[bytes]) -> None:
        with self._lock:
            self._unconfirmed = {entry for entry in self._unconfirmed if entry[1] not in settled}
            self.stale = bool(self._unconfirmed)

    def __len__(self) -> int:
        with self._lock:
            return len(self._delivered)


_holdings: tuple[int, Holdings] | None = None


def process_holdings() -> Holdings:
    """This process's holdings (a forked child starts with none)."""
    global _holdings
    with _leases_lock:
        if _holdings is None or _holdings[0] != os.getpid():
            _holdings = (os.getpid(), Holdings())
        return _holdings[1]
