"""kombu's Redis transport, made to lose no message when a worker dies, and to survive a broker restart
while calls are running.

Taking a message is one atomic step: a script (the fair take over the queue's tenants, ``scheduler.py``)
moves it from the queue into this process's in-flight list, where kombu's ``BRPOP`` took it off the queue
one round trip before recording it (a worker killed in between lost it). The process holds a lease on what
it took and renews it; when a holder dies, the live workers hand its messages back within seconds
(``leases.py``). Acknowledging or rejecting a message removes it from the in-flight list too.

kombu 5.7's ``Channel.close()`` first reads the pending poll reply; on a dead connection that read raises
before the channel is marked closed. Celery's reconnect then closes the channel a second time after
``Connection.collect()`` has detached the transport from its connection, and every later use of the channel
(restoring its unacknowledged messages, acknowledging a call that finished during the outage) rebuilds a
connection pool from ``transport.client`` — now ``None`` — and the worker stops on ``AttributeError``.
Here a failed read ends the poll and the close goes on, and a channel remembers the connection
parameters it was opened with, so a call finishing after the outage is acknowledged on the new server.

kombu also builds a new redis-py client for every acknowledgement, unacked-index update and task event
(``conn_or_acquire``); building one costs more than the command it sends. A channel here keeps one client
per connection pool (redis-py clients are safe to share between threads).

``register()`` makes this transport the one behind ``redis://`` and ``rediss://`` URLs, and its Sentinel
variant (the same channel on kombu's ``SentinelChannel``) the one behind ``sentinel://``. It is the one
extension not named by class path: a transport given as ``broker_transport`` (a class path) becomes the
URL's scheme wherever kombu renders the connection (``Connection.as_uri``), so the worker's banner would
show ``worker.queue.broker:BrokerTransport://...`` and Flower, which picks its broker page by that
scheme, would have none.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty
from typing import Any

import redis
from celery.worker import state as worker_state
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.sentinel import Sentinel

from worker.connections import parse_sentinel_url, sync_client
from worker.constants import DEFAULT_TENANT
from worker.queue import scheduler
from worker.queue.leases import Leases, delivery_tag, inflight_key
from worker.settings import get_settings

# A test hook: seconds to wait between taking a message and handing it to the consumer, so that a test
# can kill a worker inside what used to be kombu's window. Never set in production.
PAUSE_AFTER_TAKE_ENV = "TOOLWORKER_TEST_PAUSE_AFTER_TAKE_SECONDS"
# With several queues a poll waits on one of them at a time (BLMOVE takes one source), this long at most.
_MULTI_QUEUE_WAIT_S = 0.1

_leases: tuple[int, Leases] | None = None
_leases_lock = threading.Lock()


def process_leases(channel: kombu_redis.Channel) -> Leases:
    """The lease of this process, taken on its first message (and again in a forked child)."""
    global _leases
    with _leases_lock:
        if _leases is None or _leases[0] != os.getpid():
            settings = get_settings()
            client = sync_client(settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
            leases = Leases(client, settings.lease_seconds, channel.unacked_key, channel.unacked_index_key, _in_use)
            leases.start()
            atexit.register(leases.release)
            _leases = (os.getpid(), leases)
        return _leases[1]


def _in_use() -> set[str]:
    """Delivery tags of the messages the worker has received and not finished (Celery's own records)."""
    requests = [*worker_state.reserved_requests, *worker_state.active_requests]
    return {str(r.message.delivery_tag) for r in requests if getattr(r, "message", None) is not None}


# How long a worker that was woken for nothing (every tenant with work at its max_in_flight) waits before
# it looks again, instead of waiting on a list that is not empty.
_NAP_S = 0.05
_NAP_KEY = "toolworker:tenants:nap"  # never pushed: a wait on it is a pause on the connection


class QoS(kombu_redis.QoS):
    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        """kombu's unacked records and, in the same round trip, the in-flight list entry."""
        pipe = super()._remove_from_indices(delivery_tag, pipe)
        entry = self.channel.taken.get(bytes_to_str(delivery_tag))
        if entry is not None:
            pipe.lrem(entry[0], 1, entry[1])
            scheduler.release(pipe, self.channel.source_of(entry[0]), entry[1])
        return pipe

    def ack(self, delivery_tag: str) -> None:
        super().ack(delivery_tag)
        self.channel.taken.pop(delivery_tag, None)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        super().reject(delivery_tag, requeue=requeue)
        self.channel.taken.pop(delivery_tag, None)

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        """kombu's restore, or from the in-flight entry when kombu's record of the message is gone (a
        failover can keep a take and lose the record written a round trip after it)."""
        entry = self.channel.taken.get(bytes_to_str(tag))
        with self.channel.conn_or_acquire(client) as conn:
            if entry is None or conn.hexists(self.unacked_key, tag):
                super().restore_by_tag(tag, client=conn, leftmost=leftmost)
            else:
                conn.zrem(self.unacked_index_key, tag)
                process_leases(self.channel).put_back(entry[0], entry[1], leftmost)
        self.channel.taken.pop(bytes_to_str(tag), None)


class Channel(kombu_redis.Channel):
    """Takes messages with the fair take (scheduler.TAKE: every queue, tenant and priority, the message
    recorded in the same step) or, when none is waiting, waits for one with `BLMOVE` on one queue's own
    key without taking it (scheduler's docstring)."""

    QoS = QoS
    _opened_with: dict[bool, dict[str, Any]]
    _wait_next = False
    _woken = False  # the last wait ended because the queue's list was not empty
    _nap = False  # woken for nothing: pause before looking again
    _in_poll: Any
    _brpop_sent_at: Any

    @property
    def taken(self) -> dict[str, tuple[str, bytes]]:
        """Delivery tag -> (in-flight list, the message as taken), for the messages not yet acknowledged
        (the process's, kept by its lease: what its in-flight lists hold beyond these is an orphan)."""
        return process_leases(self).taken

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self.__dict__.get("_shared_client")
        if shared is None or shared.connection_pool is not self.pool:
            shared = self.__dict__["_shared_client"] = self._create_client()
        yield shared

    def close(self) -> None:
        if self._in_poll:
            try:
                self._brpop_read()
            except (Empty, *self.connection_errors):
                pass  # the read always ends the poll; the connection is dropped on error
        super().close()

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        """What kombu restores when a channel closes, out of the in-flight list too (kombu's own restore
        leaves the entry there, and the message would be put back twice)."""
        self.qos.restore_by_tag(message.delivery_tag, leftmost=leftmost)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        opened = self.__dict__.setdefault("_opened_with", {})
        if self.connection.client is not None or asynchronous not in opened:
            opened[asynchronous] = super()._connparams(asynchronous=asynchronous)
        return dict(opened[asynchronous])

    def _brpop_start(self, timeout: float | None = None) -> None:
        """Take the next message due (scheduler.TAKE), or (after a take found none) wait for one to come."""
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        if self._wait_next:
            wait_s = self.brpop_timeout if timeout is None else timeout
            if len(queues) > 1:
                wait_s = min(wait_s, _MULTI_QUEUE_WAIT_S)
                self._queue_cycle.rotate(queues[0])  # the next wait is on the next queue
            key, wait_s = (_NAP_KEY, _NAP_S) if self._nap else (self._q_for_pri(queues[0], 0), wait_s)
            # A list moved onto itself, right to right: returns once it is not empty, and takes nothing.
            command: list[Any] = ["BLMOVE", key, key, "RIGHT", "RIGHT", wait_s or 0]
        else:
            prefix = inflight_key(process_leases(self).holder, "")
            suffixes = [self._q_for_pri("", pri) for pri in self.priority_steps]
            command = scheduler.take_command(queues, prefix, suffixes)
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        self.client.connection.send_command(*command)

    def _brpop_read(self, **options: Any) -> bool:
        waited = self._wait_next
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BLMOVE" if waited else "EVAL", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next poll reconnects
                raise
            if waited:  # woken (or the wait ran out): take next
                self._wait_next, self._woken = False, bool(reply)
                raise Empty()
            self._wait_next, self._nap, self._woken = not reply, not reply and self._woken, False
            if not reply:
                raise Empty()
            self._deliver_taken(bytes_to_str(reply[0]), reply[1])
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def source_of(self, inflight: str) -> str:
        """The queue list a message in this process's in-flight list `inflight` was taken from."""
        return inflight[len(inflight_key(process_leases(self).holder, "")) :]

    def _do_restore_message(
        self, payload: Any, exchange: Any, routing_key: Any, pipe: Any, leftmost: bool = False
    ) -> None:
        """A message put back (a rejected or unfinished one) goes back to the list it was taken from."""
        entry = self.taken.get(str((payload.get("properties") or {}).get("delivery_tag")))
        if entry is None:
            return super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)  # type: ignore[no-any-return]
        source = self.source_of(entry[0])
        if scheduler.source_of(source)[1] == DEFAULT_TENANT:
            super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        else:
            payload["headers"]["redelivered"] = True
            payload["properties"].setdefault("delivery_info", {})["redelivered"] = True
            (pipe.lpush if leftmost else pipe.rpush)(source, dumps(payload))
        scheduler.requeued(pipe, source, entry[1], in_flight=False)
        return None

    def _deliver_taken(self, source: str, item: bytes) -> None:
        tag = delivery_tag(item)
        if tag is not None:
            self.taken[tag] = (inflight_key(process_leases(self).holder, source), item)
        pause_s = float(os.environ.get(PAUSE_AFTER_TAKE_ENV) or 0)
        if pause_s:
            time.sleep(pause_s)  # a test kills the worker here, between taking and recording
        queue = source.rsplit(self.sep, 1)[0]
        self._queue_cycle.rotate(queue)
        self.connection._deliver(loads(bytes_to_str(item)), queue)


class BrokerTransport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """The channel above on kombu's Sentinel channel: its pools ask the Sentinels for the primary. The
    Sentinels' addresses are remembered at opening, like the connection parameters, for the same reason."""

    master_name: str

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self._sentinel_urls = list(connection.client.alt)
        super().__init__(connection, *args, **kwargs)

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        params = self._connparams(asynchronous)
        params.pop("host", None)
        params.pop("port", None)
        nodes = parse_sentinel_url(";".join(self._sentinel_urls)).nodes
        manager = Sentinel(list(nodes), sentinel_kwargs=getattr(self, "sentinel_kwargs", None), **params)
        setattr(self, "_async_sentinel_manager" if asynchronous else "_sentinel_manager", manager)
        credentials = {key: params[key] for key in ("username", "password") if key in params}
        return manager.master_for(self.master_name, redis.Redis, **credentials).connection_pool


class SentinelBrokerTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def register() -> None:
    for scheme in ("redis", "rediss"):
        TRANSPORT_ALIASES[scheme] = f"{__name__}:BrokerTransport"
    TRANSPORT_ALIASES["sentinel"] = f"{__name__}:SentinelBrokerTransport"
