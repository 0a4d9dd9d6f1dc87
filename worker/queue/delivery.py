"""Handing what a take returned to kombu's consumer, or refusing it: the broker channel's delivery.

A taken item becomes a transport message the consumer reads; one that is no message (not JSON, not an
object, no ``properties``, over ``TOOLWORKER_MAX_MESSAGE_BYTES``) is dead-lettered and removed from the
in-flight list instead, and so is a reply consumed without acknowledgement (broker.py's docstring).
"""

from __future__ import annotations

import hashlib
import os
import time
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str

from worker.protocol import kombu_loads
from worker.queue import scheduler
from worker.queue.dead_letter import refuse_item, refuse_oversize
from worker.queue.holdings import process_holdings, process_leases
from worker.queue.leases import inflight_key
from worker.settings import get_settings

# A test hook: seconds to wait between taking a message and handing it to the consumer, so that a test
# can kill a worker inside what used to be kombu's window. Never set in production.
PAUSE_AFTER_TAKE_ENV = "TOOLWORKER_TEST_PAUSE_AFTER_TAKE_SECONDS"

# Removes the item with this SHA-1 from the head of an in-flight list, where a take pushed it, among the
# others of the same take (Redis computes the digests; the item is not sent). KEYS[1]: the in-flight list.
# ARGV[1]: the item's SHA-1, hex; ARGV[2]: how many items at the head to look at.
_DROP_HEAD = """
for _, item in ipairs(redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)) do
  if redis.sha1hex(item) == ARGV[1] then
    redis.call('LREM', KEYS[1], 1, item)
    return 1
  end
end
return 0
"""


_REFUSED = object()  # an item not handed to kombu (a JSON `null` decodes to None)


class _NotATransportMessage(Exception):
    """A queue item kombu cannot read as a message (never leaves the broker's channel)."""


class Message(virtual.Message):
    """kombu's message; an item without its fields raises one error this module catches, before the consumer
    sees anything (kombu's own KeyError or TypeError would stop the consumer)."""

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        try:
            super().__init__(payload, channel=channel, **kwargs)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _NotATransportMessage(f"not a transport message: {type(exc).__name__}: {exc}") from exc
        if not isinstance(self.delivery_tag, str):
            raise _NotATransportMessage("not a transport message: its delivery_tag is not a string")
        if not isinstance(self.delivery_info, dict) or not {"exchange", "routing_key"} <= self.delivery_info.keys():
            raise _NotATransportMessage("not a transport message: no delivery_info with exchange and routing_key")


class DeliveringChannel(kombu_redis.Channel):
    """kombu's Redis channel, handing taken items to the consumer (or refusing them): the part of the
    broker's channel (broker.py) that knows which queues are read without acknowledgement."""

    Message = Message

    @property
    def _no_ack_queues(self) -> set[str]:
        queues: set[str] = self.__dict__.setdefault("_no_ack", set())
        return queues

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        self._no_ack_queues.discard(queue)
        return super().basic_cancel(consumer_tag)

    def source_of(self, inflight: str) -> str:
        """The queue list a message in this process's in-flight list `inflight` was taken from."""
        return inflight[len(inflight_key(process_leases(self).holder, "")) :]

    def _deliver_all(self, taken: list[tuple[bytes, bytes]]) -> None:
        """Hand every message of a take to the consumer, in the order taken; Empty if none was a message. If
        handing one fails, those after it are left to the reconcile before the next take, which puts them
        back (they were taken, and are not held)."""
        delivered = False
        for index, (source, item) in enumerate(taken):
            try:
                self._deliver_taken(bytes_to_str(source), item)
            except Empty:
                continue
            except BaseException:
                if index + 1 < len(taken):
                    process_holdings().unsure()
                raise
            delivered = True
        if not delivered:
            raise Empty()

    def _deliver_taken(self, source: str, item: bytes) -> None:
        """Hand a taken item to the consumer; one that is not a message is refused and dropped instead."""
        inflight = inflight_key(process_leases(self).holder, source)
        queue = source.rsplit(self.sep, 1)[0]
        self._queue_cycle.rotate(queue)
        payload = self._transport_payload(item)
        if payload is _REFUSED:
            self._drop(inflight, item)
            raise Empty()  # nothing delivered: the consumer takes again
        tag = _delivery_tag(payload)
        acknowledged = queue not in self._no_ack_queues
        if not acknowledged:
            self._drop(inflight, item)
        elif tag is not None:
            process_holdings().hold(tag, inflight, item)
        pause_s = float(os.environ.get(PAUSE_AFTER_TAKE_ENV) or 0)
        if pause_s:
            time.sleep(pause_s)  # a test kills the worker here, between taking and recording
        try:
            self.connection._deliver(payload, queue)
        except _NotATransportMessage as exc:
            refuse_item(str(exc), item, payload)
            if acknowledged:
                if tag is not None:
                    process_holdings().settled(tag, confirmed=True)
                self._drop(inflight, item)
            raise Empty() from None
        except BaseException:
            if tag is not None and acknowledged and tag not in self.qos._delivered:
                process_holdings().released(tag)  # it never reached the consumer: the reconcile puts it back
            raise

    def _transport_payload(self, item: bytes) -> Any:
        """The item decoded, or _REFUSED when it is refused (too large to decode, or not JSON)."""
        limit_bytes = get_settings().max_message_bytes
        if len(item) > limit_bytes:
            refuse_oversize(item, limit_bytes)
            return _REFUSED
        try:
            return kombu_loads(item)
        except (ValueError, RecursionError) as exc:
            refuse_item(f"not a transport message: not JSON ({type(exc).__name__})", item, None)
            return _REFUSED

    def _drop(self, inflight: str, item: bytes) -> None:
        """Remove an item just taken from the in-flight list now: nobody acknowledges it. It is the list's
        head (a take pushes there, and nothing is taken meanwhile), named by its digest: an item of 20 MB
        is not sent back to Redis to be found."""
        try:
            with self.conn_or_acquire() as client:
                digest = hashlib.sha1(item).hexdigest()
                dropped = client.eval(_DROP_HEAD, 1, inflight, digest, scheduler.TAKE_AT_ONCE)
                if dropped:  # its tenant's calls are not running
                    with client.pipeline(transaction=False) as pipe:
                        scheduler.release(pipe, self.source_of(inflight), item)
                        pipe.execute()
        except self.connection_errors:
            dropped = 0
        if not dropped:
            process_holdings().unconfirmed(inflight, item)  # removed on the next reconcile


def _delivery_tag(payload: Any) -> str | None:
    properties = payload.get("properties") if isinstance(payload, dict) else None
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    return tag if isinstance(tag, str) else None
