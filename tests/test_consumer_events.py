"""Task events of a burst of messages leave in the consumer's timed flush, not a publication every 24."""

from __future__ import annotations

from typing import Any

from celery import Celery

from worker.queue.consumer import DeadLetteringConsumer


def test_task_events_wait_for_the_timed_flush_and_leave_in_one_publication() -> None:
    app = Celery(broker="memory://", set_as_current=False)
    consumer = DeadLetteringConsumer.__new__(DeadLetteringConsumer)  # only the dispatcher is looked at
    published: list[Any] = []
    with app.connection_for_write() as connection:
        dispatcher = app.events.Dispatcher(connection, hostname="w", enabled=True, buffer_group=["task"])
        dispatcher._publish = lambda event, producer, routing_key, **kw: published.append(event)
        consumer.event_dispatcher = dispatcher  # as Celery's Events step sets it
        for n in range(100):  # what 33 messages send: received, started, succeeded
            dispatcher.send("task-received", uuid=str(n))
        assert published == []
        dispatcher.flush()
    assert [len(batch) for batch in published] == [100]
    assert consumer.event_dispatcher is dispatcher
