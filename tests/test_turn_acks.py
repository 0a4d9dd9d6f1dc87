"""The acknowledgements of one turn of the consumer's loop, settled together (worker/queue/broker.py), at the
seam with kombu's hub and a fake Redis: when one is kept for the end of the turn, what the settlement does to
the in-flight lists and the holdings, and what a failed one leaves for the reconcile."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fakeredis
import pytest
import redis
from kombu.asynchronous import Hub, set_event_loop

from worker.queue import broker, holdings

INFLIGHT = "toolworker:inflight:test:toolcalls"


class FakeQoS:
    """What the settlement uses of kombu's QoS: the channel's client, the removal, the in-memory ack."""

    def __init__(self, client: Any) -> None:
        self.channel = self
        self.client = client
        self.acked: list[str] = []

    @contextmanager
    def conn_or_acquire(self) -> Iterator[Any]:
        yield self.client

    def _remove_from_indices(self, tag: str, pipe: Any) -> Any:
        pipe.lrem(INFLIGHT, 1, tag.encode())
        return pipe

    def _quick_ack(self, tag: str) -> None:
        self.acked.append(tag)


@pytest.fixture
def hub() -> Iterator[Hub]:
    hub = Hub()
    hub._loop_thread = threading.get_ident()  # as create_loop sets it: this thread runs the loop
    set_event_loop(hub)
    try:
        yield hub
    finally:
        set_event_loop(None)
        hub.close()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> holdings.Holdings:
    fresh = holdings.Holdings()
    monkeypatch.setattr(broker, "process_holdings", lambda: fresh)
    monkeypatch.setattr(broker, "_turn_acks", broker._TurnAcks())
    for tag in ("t1", "t2"):
        fresh.hold(tag, INFLIGHT, tag.encode())
    return fresh


def test_a_turns_acknowledgements_leave_together_at_its_end(hub: Hub, held: holdings.Holdings) -> None:
    client = fakeredis.FakeRedis()
    client.lpush(INFLIGHT, b"t1", b"t2", b"other")
    qos = FakeQoS(client)
    assert broker._turn_acks.defer(qos, "t1") and broker._turn_acks.defer(qos, "t2")  # type: ignore[arg-type]
    assert client.llen(INFLIGHT) == 3 and held.entry("t1") is not None  # nothing sent yet
    for tick in list(hub.on_tick):  # the end of the turn
        tick()
    assert client.lrange(INFLIGHT, 0, -1) == [b"other"]
    assert held.entry("t1") is None and held.entry("t2") is None and not held.stale
    assert qos.acked == ["t1", "t2"]


def test_a_failed_settlement_is_left_to_the_reconcile(hub: Hub, held: holdings.Holdings) -> None:
    class Lost:
        def pipeline(self, transaction: bool = False) -> Any:
            raise redis.ConnectionError("gone")

    qos = FakeQoS(Lost())
    assert broker._turn_acks.defer(qos, "t1")  # type: ignore[arg-type]
    broker._turn_acks.settle()
    assert held.entry("t1") is None and held.stale  # settled here; Redis may hold it: the reconcile removes it
    assert held.snapshot()[1] == {b"t1"}


def test_off_the_loop_or_while_it_closes_an_acknowledgement_is_made_at_once(hub: Hub, held: holdings.Holdings) -> None:
    qos = FakeQoS(fakeredis.FakeRedis())
    elsewhere: list[bool] = []
    thread = threading.Thread(target=lambda: elsewhere.append(broker._turn_acks.defer(qos, "t1")))  # type: ignore[arg-type]
    thread.start()
    thread.join()
    assert elsewhere == [False]
    hub._close_poller()  # the loop has stopped polling: what is left to do runs now, not at a next turn
    assert not broker._turn_acks.defer(qos, "t1")  # type: ignore[arg-type]


def test_a_loop_closed_before_its_turn_ended_settles_what_it_kept(hub: Hub, held: holdings.Holdings) -> None:
    client = fakeredis.FakeRedis()
    client.lpush(INFLIGHT, b"t1")
    assert broker._turn_acks.defer(FakeQoS(client), "t1")  # type: ignore[arg-type]
    hub.close()
    assert client.llen(INFLIGHT) == 0 and held.entry("t1") is None
