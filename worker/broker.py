"""kombu's Redis transport, made to survive a broker restart while calls are running.

kombu 5.7's ``Channel.close()`` first reads the pending BRPOP reply; on a dead connection that read raises
before the channel is marked closed. Celery's reconnect then closes the channel a second time after
``Connection.collect()`` has detached the transport from its connection, and every later use of the channel
(restoring its unacknowledged messages, acknowledging a call that finished during the outage) rebuilds a
connection pool from ``transport.client`` — now ``None`` — and the worker stops on ``AttributeError``.

Here a failed BRPOP read ends the poll and the close goes on, and a channel remembers the connection
parameters it was opened with, so a call finishing after the outage is acknowledged on the new server.
``use()`` makes this transport the one behind ``redis://`` and ``rediss://`` URLs, so the broker URL, the
worker's banner and Flower's broker page stay what operators configured.
"""

from __future__ import annotations

from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _opened_with: dict[bool, dict[str, Any]]

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


class Transport(kombu_redis.Transport):
    Channel = Channel


def use() -> None:
    for scheme in ("redis", "rediss"):
        TRANSPORT_ALIASES[scheme] = f"{__name__}:Transport"
