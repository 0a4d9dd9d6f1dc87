"""Celery's consumer, with three changes: messages that are not calls are dead-lettered, task events
leave in one flush, and a lost broker is tried again about every second, however long it is away."""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer

from worker.queue.dead_letter import answer_undecodable, dead_letter

_EVENTS_FLUSH_DELAY_S = 0.02
# Task events kept for that flush before one is made at once (Celery's 24 makes a publication every 8 messages).
_EVENTS_BUFFER_LIMIT = 256
# kombu's reconnect waits 2 s more after each failed try (up to 30 s): a shard or primary back after a long
# outage would wait that long for its calls to be taken again.
_RECONNECT_EVERY_S = 1.0


class DeadLetteringConsumer(Consumer):
    """Messages that are not calls at all (undecodable, unknown task) are kept in a dead-letter list
    with the reason, and the worker goes on consuming.

    Task events leave in one flush a few milliseconds after the first is buffered, not at once: a
    call's received, started and succeeded events then go out together, after the call rather than
    while it runs (Celery flushes on the next loop turn, twice per message), and so do those of the
    other messages of those milliseconds."""

    _events_flush_scheduled = False
    _event_dispatcher: Any = None

    @property
    def event_dispatcher(self) -> Any:
        return self._event_dispatcher

    @event_dispatcher.setter
    def event_dispatcher(self, dispatcher: Any) -> None:  # made by Celery's Events step at each (re)start
        if dispatcher is not None:
            dispatcher.buffer_limit = _EVENTS_BUFFER_LIMIT
        self._event_dispatcher = dispatcher

    def on_send_event_buffered(self) -> None:
        if self.hub and not self._events_flush_scheduled:
            self._events_flush_scheduled = True
            self.hub.call_soon(self._schedule_events_flush)  # thread-safe; the timer is not

    def _schedule_events_flush(self) -> None:
        self.hub.call_later(_EVENTS_FLUSH_DELAY_S, self._flush_events_later)

    def _flush_events_later(self) -> None:
        self._events_flush_scheduled = False  # first: an event buffered from now on schedules a flush
        self._flush_events()

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection, interval_start=0, interval_step=_RECONNECT_EVERY_S, interval_max=_RECONNECT_EVERY_S
        )
        return super().ensure_connected(conn)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        dead_letter("undecodable message", exc, message.body)
        task_id = (message.headers or {}).get("id")
        if isinstance(task_id, str) and task_id:
            answer_undecodable(task_id, message.body)
        message.ack()

    # Not Celery's handlers, in all four: they log the message's body (call-header values included).

    def on_unknown_message(self, body: Any, message: Any) -> None:
        dead_letter("not a task message", None, body)
        message.ack()

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        task = (message.headers or {}).get("task")
        dead_letter(f"unknown task {str(task)[:200]!r}", None, _body_of(message, body))
        message.ack()

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter("invalid task message", exc, _body_of(message, body))
        message.ack()


def _body_of(message: Any, body: Any) -> Any:
    """The message's body as sent (Celery passes None for protocol 2), for its redacted record."""
    if body is not None:
        return body
    try:
        return message.decode()
    except Exception:  # a body that cannot be decoded is recorded by its size and digest only
        return message.body
