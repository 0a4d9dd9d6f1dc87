"""kombu's Redis transport, made to lose no message when a worker dies, and to survive a broker restart
while calls are running.

Taking a message is one atomic step: a script (the fair take over the queue's tenants, ``scheduler.py``;
as many messages as the consumer may still hold, up to ``scheduler.TAKE_AT_ONCE``) moves it from the queue
into this process's in-flight list, where kombu's ``BRPOP`` took it off the queue
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
per connection pool (redis-py clients are safe to share between threads). kombu's unacked records are not
written at all (``QoS``): the in-flight lists hold the same messages.

**What a process holds, and what Redis says it holds.** A take or an acknowledgement whose reply is lost
(Redis killed after it wrote the command to its append-only file, before the reply left) leaves the two
disagreeing: a message moved into the in-flight list that the process never read (it stays there under a
live lease, never answered), or a message acknowledged in memory that stays in the list (held until the
process exits). ``Holdings`` is the process's own account: the messages delivered and not yet settled, and
the settlements Redis may have missed. Before its first take on every new connection (at start, after a
reconnect, whichever path made it), and before the next take after a settlement failed, the channel
reconciles: an in-flight entry
the process does not hold goes back to its queue, unless the process settled it, and then it is only
removed (``Leases.reconcile``). Nothing is taken meanwhile, and an acknowledgement removes the entry before
it leaves the account, so an entry reconciled away is never one a call still runs on.

**A lost connection puts back only what nobody runs.** Celery's consumer then closes the channel, and kombu
would put back every message the channel delivered and nobody settled, calls still running here included:
they run on (``worker_cancel_long_running_tasks_on_connection_loss`` is off), and another worker would take
the copy (after a failover, from the promoted primary) and send the call upstream a second time. A message
handed to the worker pool (``pool.py`` marks it started in ``Holdings``) is not put back: it stays in this
process's in-flight list, under its lease, and held, so the reconcile after the reconnect leaves it, and the
call's own acknowledgement or rejection settles it on the new connection (a closed channel rebuilds its pool
from the parameters it was opened with). If the process dies first, its lease lapses and the live workers
hand the message back, as any dead holder's. A message received and not started (an ETA not yet due, a rate
limit's wait: the consumer forgets those as it reconnects) goes back to its queue; one whose restore fails
is no longer held, and the reconcile puts it back.

**A take the replicas did not confirm** (with ``TOOLWORKER_REDIS_MIN_REPLICAS``, a ``WAIT`` for every replica
the primary has, N of them enough, follows every take in the same round trip) is held, not run: neither
delivered nor put back, and counted as held by the reconcile. Before anything else is taken, the channel asks
the primary (the promoted one, after a failover) whether the message is still in this holder's in-flight
list, with a write and a ``WAIT`` after it (``_TAKE_STANDS``): there and on the replicas, the call runs; not
there (the promoted replica never had the take: the message is back on its queue, or another worker has it),
the copy is dropped; not yet on the replicas, the question is asked again.

An idle channel waits on its queue's list (``BLMOVE``, which takes nothing): a take that leaves the queue
empty says so, and the next poll waits at once; a wait that runs out is followed by another, with a take
only every third (scheduler.py's docstring).

**Items that are not transport messages** (not JSON, not an object, no ``properties``, over
``TOOLWORKER_MAX_MESSAGE_BYTES``) never reach kombu, which would stop the consumer on them: they are
dead-lettered (``dead_letter.py``), answered when they name a task id, and removed from the in-flight
list. A message over the size limit is not even decoded. Messages consumed without acknowledgement (the
replies to a ``ping``) are removed from the in-flight list as they are taken: nobody acknowledges them.

**Where each part lives.** The channel is built in layers, one job each: ``delivery.py`` hands a taken
item to the consumer or refuses it, ``held_takes.py`` decides the takes the replicas did not confirm,
``holdings.py`` keeps the process's account and its lease; this module has the poll (take or wait), the
settlements (``QoS``) and what keeps the channel usable across a reconnect.

``register()`` makes this transport the one behind ``redis://`` and ``rediss://`` URLs, and its Sentinel
variant (the same channel on kombu's ``SentinelChannel``) the one behind ``sentinel://``. It is the one
extension not named by class path: a transport given as ``broker_transport`` (a class path) becomes the
URL's scheme wherever kombu renders the connection (``Connection.as_uri``), so the worker's banner would
show ``worker.queue.broker:BrokerTransport://...`` and Flower, which picks its broker page by that
scheme, would have none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty
from typing import Any

import redis
from kombu.asynchronous import get_event_loop
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps
from redis.sentinel import Sentinel

from worker.connections import SentinelPool, parse_sentinel_url, replica_count
from worker.constants import DEFAULT_TENANT
from worker.queue import scheduler
from worker.queue.delivery import PAUSE_AFTER_TAKE_ENV
from worker.queue.held_takes import DecidingChannel
from worker.queue.holdings import process_holdings, process_leases
from worker.queue.leases import Leases, inflight_key
from worker.settings import get_settings

__all__ = ["PAUSE_AFTER_TAKE_ENV", "BrokerTransport", "Channel", "SentinelBrokerTransport", "register"]

# With several queues a poll waits on one of them at a time (BLMOVE takes one source), this long at most.
_MULTI_QUEUE_WAIT_S = 0.1

# How long a worker that was woken for nothing (every tenant with work at its max_in_flight) waits before
# it looks again, instead of waiting on a list that is not empty.
_NAP_S = 0.05
_NAP_KEY = "toolworker:tenants:nap"  # never pushed: a wait on it is a pause on the connection
# An idle worker's wait on its queue's list ends when anything is pushed there (a named tenant's push and a
# release of a capped tenant's calls push a wake-up): a wait that ran out is followed by another, and only
# every third by a look at every list (a stock producer's priority lists are not waited on).
_LOOK_EVERY_WAITS = 3


class QoS(kombu_redis.QoS):
    """kombu's, with every settlement (ack, reject, restore) removing the message from the in-flight list in
    the same round trip, and recorded in the process's holdings whether or not Redis answered.

    kombu's own records of a delivered message (its `unacked` hash and index, written at delivery, removed
    at settlement, swept after the visibility timeout) are not kept: the in-flight list, written by the
    take itself, holds every message they would, and leases hand a dead holder's back in seconds. That is
    six commands a message less, and no sweep while idle. (Records an older worker left are still removed
    when their message is settled or restored here.)"""

    def append(self, message: Any, delivery_tag: Any) -> None:
        virtual.QoS.append(self, message, delivery_tag)  # in memory only

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        """Nothing is recorded for the visibility timeout to restore (leases do it)."""

    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        entry = process_holdings().entry(bytes_to_str(delivery_tag))
        if entry is None:  # not taken by this process's take: kombu's records may hold it
            return super()._remove_from_indices(delivery_tag, pipe)
        if pipe is None:  # not kombu's transaction: the script is one step
            with self.channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
        scheduler.settle(pipe, entry[0], self.channel.source_of(entry[0]), entry[1])
        return pipe

    def ack(self, delivery_tag: str) -> None:
        if process_holdings().entry(bytes_to_str(delivery_tag)) is not None and _turn_acks.defer(self, delivery_tag):
            return  # settled with the others of the consumer loop's turn
        with _settling(delivery_tag):
            super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        with _settling(delivery_tag, requeue):
            super().reject(delivery_tag, requeue=requeue)

    def restore_unacked(self, client: Any = None) -> None:
        """What a closing channel delivered and nobody settled goes back to its queue, but for the messages
        whose calls this process runs: they stay held, each settled by its call's own acknowledgement on the
        connection open by then (the module's docstring). One that cannot be put back now is not held any
        more: the reconcile puts it back."""
        holdings, kept, failed = process_holdings(), 0, 0
        for tag in list(self._delivered):
            if holdings.running(bytes_to_str(tag)):
                kept += 1
                continue
            try:
                self.restore_by_tag(tag, client=client)
            except redis.RedisError:
                failed += 1
        self._delivered.clear()
        if kept:
            kombu_redis.logger.info("Kept %d message(s) whose calls run here: their acknowledgements settle them", kept)
        if failed:
            kombu_redis.logger.warning("Could not restore %d message(s) now: the reconcile puts them back", failed)

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        """kombu's restore, or from the in-flight entry when kombu's record of the message is gone (a
        failover can keep a take and lose the record written a round trip after it). A restore that fails
        leaves the message to the reconcile, which puts it back (only a message nobody runs is restored)."""
        entry = process_holdings().entry(bytes_to_str(tag))
        with _settling(bytes_to_str(tag), requeue=True), self.channel.conn_or_acquire(client) as conn:
            if entry is None or conn.hexists(self.unacked_key, tag):
                super().restore_by_tag(tag, client=conn, leftmost=leftmost)
            else:
                conn.zrem(self.unacked_index_key, tag)
                process_leases(self.channel).put_back(entry[0], entry[1], leftmost)


class _TurnAcks:
    """The acknowledgements Celery makes on its consumer's event loop (it hands every one there) during one turn
    of the loop leave in one round trip, before the loop waits again (`Hub.on_tick` runs after the turn's
    ready callbacks, before the poll). A failed round trip is logged, as Celery logs a failed acknowledgement,
    and remembered for the reconcile, as `_settling` does for one."""

    def __init__(self) -> None:
        self._acks: list[tuple[QoS, str]] = []

    def defer(self, qos: QoS, tag: str) -> bool:
        """Keep the acknowledgement for the end of the turn; False when not in a turn of the loop (made now):
        another thread, or the loop closing, which runs what is left to do once it has stopped polling."""
        hub = get_event_loop()
        if hub is None or hub._loop_thread != threading.get_ident() or hub._poller is None:
            return False
        if self.settle not in hub.on_tick:
            hub.on_tick.add(self.settle)
            hub.on_close.add(self._closing)  # a loop stopped between a turn's callbacks and its tick
        self._acks.append((qos, tag))
        return True

    def _closing(self, hub: Any) -> None:
        self.settle()

    def settle(self) -> None:
        acks, self._acks = self._acks, []
        by_qos: dict[QoS, list[str]] = {}
        for qos, tag in acks:
            by_qos.setdefault(qos, []).append(tag)
        for qos, tags in by_qos.items():
            confirmed = True
            try:
                with qos.channel.conn_or_acquire() as client:
                    pipe = client.pipeline(transaction=False)
                    for tag in tags:
                        qos._remove_from_indices(tag, pipe)
                    pipe.execute()
            except Exception as exc:
                confirmed = False
                kombu_redis.logger.critical("Couldn't ack %d message(s), reason: %r", len(tags), exc)
            for tag in tags:
                process_holdings().settled(bytes_to_str(tag), confirmed)
                virtual.QoS.ack(qos, tag)


_turn_acks = _TurnAcks()


@contextmanager
def _settling(tag: str, requeue: bool = False) -> Iterator[None]:
    """Settle a message in the holdings after its removal from Redis was tried; a failure is remembered so
    that it is made good once Redis is back: a removal is made again, and a message that was to go back to
    its queue (a reject with requeue: its call has no published result) is no longer held, so that the
    reconcile puts it back rather than only removing it, which would lose the call."""
    try:
        yield
    except BaseException:
        if requeue:
            process_holdings().released(tag)
        else:
            process_holdings().settled(tag, confirmed=False)
        raise
    process_holdings().settled(tag, confirmed=True)


class Channel(DecidingChannel):
    """Takes messages with the fair take (scheduler.TAKE: every queue, tenant and priority, the message
    recorded in the same step) or, when none is waiting, waits for one with `BLMOVE` on one queue's own
    key without taking it (scheduler's docstring). A channel that only reads replies (consumed without
    acknowledgement) takes them as kombu does, recording nothing."""

    QoS = QoS
    _opened_with: dict[bool, dict[str, Any]]
    _polled_plainly = False  # kombu's own BRPOP is outstanding
    _wait_next = False
    _woken = False  # the last wait ended because the queue's list was not empty
    _nap = False  # woken for nothing: pause before looking again
    _reconciled_on: Any = None  # the socket of the take connection when this channel last reconciled
    _take_waits = 0  # a WAIT for this many replicas follows the take on the wire (MIN_REPLICAS), then ROLE
    _lone_wait = False  # the wait on the wire is on the only queue's own list
    _quiet_waits = 0  # waits in a row that ran out
    _in_poll: Any
    _brpop_sent_at: Any

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
        """The parameters the channel was opened with, once the transport (Connection.collect) or the close
        has detached it from its connection: an acknowledgement after a reconnect still reaches Redis."""
        opened = self.__dict__.setdefault("_opened_with", {})
        connection = self.connection  # None once the channel is closed
        if (connection is not None and connection.client is not None) or asynchronous not in opened:
            opened[asynchronous] = super()._connparams(asynchronous=asynchronous)
        return dict(opened[asynchronous])

    def _brpop_start(self, timeout: float | None = None) -> None:
        """Take the next message due (scheduler.TAKE), or (after a take found none) wait for one to come."""
        if self.active_queues and set(self.active_queues) <= self._no_ack_queues:
            self._polled_plainly = True
            super()._brpop_start(timeout)
            return
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        leases = process_leases(self)
        connection = self.client.connection
        if connection._sock is not self._reconciled_on or process_holdings().stale:
            self._reconcile(leases)  # a new socket: a take or an ack may have been lost with the old one
            if get_settings().redis_min_replicas:  # (maybe a new primary) its replicas, before a take waits for them
                self._replicas_seen = replica_count(self.client.execute_command("ROLE"))
            self._reconciled_on = connection._sock
        untrusted = process_holdings().next_untrusted()
        if untrusted is not None:  # decided before anything else is taken
            self._ask_whether_take_stands(leases, untrusted)
            return
        if self._wait_next:
            wait_s = self.brpop_timeout if timeout is None else timeout
            if len(queues) > 1:
                wait_s = min(wait_s, _MULTI_QUEUE_WAIT_S)
                self._queue_cycle.rotate(queues[0])  # the next wait is on the next queue
            key, wait_s = (_NAP_KEY, _NAP_S) if self._nap else (self._q_for_pri(queues[0], 0), wait_s)
            self._lone_wait = len(queues) == 1 and not self._nap
            # A list moved onto itself, right to right: returns once it is not empty, and takes nothing.
            command: list[Any] = ["BLMOVE", key, key, "RIGHT", "RIGHT", wait_s or 0]
        else:
            prefix = inflight_key(leases.holder, "")
            suffixes = [self._q_for_pri("", pri) for pri in self.priority_steps]
            command = scheduler.take_command(queues, prefix, suffixes, self._take_count())
        connection = self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        commands = [command]
        needed = 0 if self._wait_next else get_settings().redis_min_replicas
        # The take on every replica the primary has (Sentinel may promote any of them), N of them before its
        # calls run: a failover now runs none twice.
        self._take_waits = max(needed, self._replicas_seen) if needed else 0
        if self._take_waits:
            timeout_ms = int(get_settings().redis_min_replicas_timeout_seconds * 1000)
            commands += [["WAIT", self._take_waits, timeout_ms], ["ROLE"]]
        connection.send_packed_command(connection.pack_commands(commands))

    def _take_count(self) -> int:
        """How many messages the next take may bring: as many as the consumer may still hold (its prefetch),
        up to scheduler.TAKE_AT_ONCE; one while takes wait for replicas (a held take is decided alone)."""
        if get_settings().redis_min_replicas:
            return 1
        room = self.qos.can_consume_max_estimate()  # None: no prefetch limit
        return scheduler.TAKE_AT_ONCE if room is None else max(1, min(scheduler.TAKE_AT_ONCE, room))

    def _reconcile(self, leases: Leases) -> None:
        """Make this holder's in-flight lists what the process holds (no take is outstanding here)."""
        holdings = process_holdings()
        snapshot: list[set[bytes]] = []

        def held() -> tuple[set[bytes], set[bytes]]:
            snapshot[:] = holdings.snapshot()
            return snapshot[0], snapshot[1]

        requeued = leases.reconcile(held)  # reads the lists first, the holdings after
        holdings.reconciled(snapshot[1])
        if requeued:
            kombu_redis.logger.warning("Requeued %d message(s) taken but never received", requeued)

    def _brpop_read(self, **options: Any) -> bool:
        if self._polled_plainly:
            self._polled_plainly = False
            result: bool = super()._brpop_read(**options)
            return result
        waited, deciding, self._deciding = self._wait_next, self._deciding, None
        try:
            try:
                if deciding is not None:
                    return self._read_decision(deciding, **options)
                if waited:
                    reply = self.client.parse_response(self.client.connection, "BLMOVE", **options)
                else:
                    reply, confirmed = self._read_take(**options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next poll reconnects
                raise
            if waited:  # woken: take next; a lone queue's wait that ran out: wait again, look now and then
                self._woken, self._quiet_waits = bool(reply), 0 if reply else self._quiet_waits + 1
                self._wait_next = self._lone_wait and not reply and self._quiet_waits % _LOOK_EVERY_WAITS != 0
                raise Empty()
            if reply and not confirmed:  # held: the next poll asks whether the take stands
                self._wait_next = self._nap = self._woken = False
                raise Empty()
            self._wait_next, self._nap, self._woken = not reply, not reply and self._woken, False
            if not reply:
                raise Empty()
            self._wait_next = len(reply) > 2 and not reply[2]  # nothing left: the next poll waits
            self._deliver_all(scheduler.taken_messages(reply))
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _read_take(self, **options: Any) -> tuple[Any, bool]:
        """The take's reply, and whether the replicas confirmed it (WAIT's reply, read even when the take
        failed). A take they did not confirm in time, or whose WAIT went with the connection, is held, not
        run: a failover now would give the promoted primary the message still on its queue."""
        connection = self.client.connection
        waits, self._take_waits = self._take_waits, 0
        try:
            reply = self.client.parse_response(connection, "EVAL", **options)
        except BaseException:
            if waits and connection._sock is not None:  # (a connection error has dropped the connection)
                self._read_wait(connection)
            raise
        try:
            acked = self._read_wait(connection) if waits else 0
        except self.connection_errors:
            if reply:
                self._hold_untrusted(reply)
            raise
        needed = get_settings().redis_min_replicas if waits else 0
        if reply and acked < needed:
            kombu_redis.logger.warning("A take reached %d of %d replicas in time: held (MIN_REPLICAS)", acked, needed)
            self._hold_untrusted(reply)
            return reply, False
        return reply, True

    def _read_wait(self, connection: Any) -> int:
        """WAIT's reply, and ROLE's after it (how many replicas the next take waits for)."""
        acked: int = self.client.parse_response(connection, "WAIT")
        self._replicas_seen = replica_count(self.client.parse_response(connection, "ROLE"))
        return acked

    def _do_restore_message(
        self, payload: Any, exchange: Any, routing_key: Any, pipe: Any, leftmost: bool = False
    ) -> None:
        """A message put back (a rejected or unfinished one) goes back to the list it was taken from."""
        entry = process_holdings().entry(str((payload.get("properties") or {}).get("delivery_tag")))
        if entry is None:
            return super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)  # type: ignore[no-any-return]  # kombu is untyped
        source = self.source_of(entry[0])
        if scheduler.source_of(source)[1] == DEFAULT_TENANT:
            super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        else:
            payload["headers"]["redelivered"] = True
            payload["properties"].setdefault("delivery_info", {})["redelivered"] = True
            (pipe.lpush if leftmost else pipe.rpush)(source, dumps(payload))
        scheduler.requeued(pipe, source, entry[1], in_flight=False)
        return None


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
        # The pool of worker/connections.py: it follows a failover mid-command, as every other client does.
        client = manager.master_for(self.master_name, redis.Redis, connection_pool_class=SentinelPool, **credentials)
        return client.connection_pool


class SentinelBrokerTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


class _OneLineRefusals(logging.Filter):
    """kombu logs a script Redis refused while it keeps its bindings alive (an ACL, a full `noeviction` server)
    as a warning with the whole traceback, every few seconds while it lasts: the warning says it in one line,
    the error's type and text, as the worker's own refusals do."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(error).__name__}: {str(error)[:200]})"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def register() -> None:
    kombu_logger = logging.getLogger("kombu.transport.redis")
    if not any(isinstance(f, _OneLineRefusals) for f in kombu_logger.filters):
        kombu_logger.addFilter(_OneLineRefusals())
    for scheme in ("redis", "rediss"):
        TRANSPORT_ALIASES[scheme] = f"{__name__}:BrokerTransport"
    TRANSPORT_ALIASES["sentinel"] = f"{__name__}:SentinelBrokerTransport"
