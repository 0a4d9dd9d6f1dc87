"""kombu's Redis transport, made to survive a broker restart while calls are running.

kombu 5.7's ``Channel.close()`` first reads the pending BRPOP reply; on a dead connection that read raises
before the channel is marked closed. Celery's reconnect then closes the channel a second time after
``Connection.collect()`` has detached the transport from its connection, and every later use of the channel
(restoring its unacknowledged messages, acknowledging a call that finished during the outage) rebuilds a
connection pool from ``transport.client`` — now ``None`` — and the worker stops on ``AttributeError``.

Here a failed BRPOP read ends the poll and the close goes on, and a channel remembers the connection
parameters it was opened with, so a call finishing after the outage is acknowledged on the new server.

kombu also builds a new redis-py client for every acknowledgement, unacked-index update and task event
(``conn_or_acquire``); building one costs more than the command it sends. A channel here keeps one client
per connection pool (redis-py clients are safe to share between threads).

``register()`` makes this transport the one behind ``redis://`` and ``rediss://`` URLs. It is the one
extension not named by class path: a transport given as ``broker_transport`` (a class path) becomes the
URL's scheme wherever kombu renders the connection (``Connection.as_uri``), so the worker's banner would
show ``worker.queue.broker:BrokerTransport://...`` and Flower, which picks its broker page by that
scheme, would have none.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _opened_with: dict[bool, dict[str, Any]]

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

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        opened = self.__dict__.setdefault("_opened_with", {})
        if self.connection.client is not None or asynchronous not in opened:
            opened[asynchronous] = super()._connparams(asynchronous=asynchronous)
        return dict(opened[asynchronous])


class BrokerTransport(kombu_redis.Transport):
    Channel = Channel


def register() -> None:
    for scheme in ("redis", "rediss"):
        TRANSPORT_ALIASES[scheme] = f"{__name__}:BrokerTransport"
