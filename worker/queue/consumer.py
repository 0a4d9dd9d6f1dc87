"""Celery's consumer, with two changes: messages that are not calls are dead-lettered, and task events
leave in one flush."""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer

from worker.queue.dead_letter import answer_undecodable, dead_letter

_EVENTS_FLUSH_DELAY_S = 0.02


class DeadLetteringConsumer(Consumer):  # type: ignore[misc]
    """Messages that are not calls at all (undecodable, unknown task) are kept in a dead-letter list
    with the reason, and the worker goes on consuming.

    Task events leave in one flush a few milliseconds after the first is buffered, not at once: a
    call's received, started and succeeded events then go out together, after the call rather than
    while it runs (Celery flushes on the next loop turn, twice per message)."""

    _events_flush_scheduled = False

    def on_send_event_buffered(self) -> None:
        if self.hub and not self._events_flush_scheduled:
            self._events_flush_scheduled = True
            self.hub.call_soon(self._schedule_events_flush)  # thread-safe; the timer is not

    def _schedule_events_flush(self) -> None:
        self.hub.call_later(_EVENTS_FLUSH_DELAY_S, self._flush_events_later)

    def _flush_events_later(self) -> None:
        self._events_flush_scheduled = False  # first: an event buffered from now on schedules a flush
        self._flush_events()

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        dead_letter("undecodable message", exc, message.body)
        task_id = (message.headers or {}).get("id")
        if isinstance(task_id, str) and task_id:
            answer_undecodable(task_id, message.body)
        # Not Celery's handler: it logs the start of the raw body, call-header values included.
        message.ack()

    def on_unknown_message(self, body: Any, message: Any) -> None:
        dead_letter("not a task message", None, body)
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter(f"unknown task {message.headers.get('task')!r}", exc, body)
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        dead_letter("invalid task message", exc, body)
        super().on_invalid_task(body, message, exc)
