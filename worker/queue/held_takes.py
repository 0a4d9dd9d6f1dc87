"""Takes the replicas did not confirm in time (``TOOLWORKER_REDIS_MIN_REPLICAS``): held, then decided.

A take whose ``WAIT`` fell short is neither run nor put back. Before anything else is taken, the channel
asks the primary (the promoted one, after a failover) whether the message is still in this holder's
in-flight list, with a write and a ``WAIT`` after it: there and on the replicas, the call runs; not there,
the copy is dropped; not yet on the replicas, the question is asked again (broker.py's docstring).
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str

from worker.queue.delivery import DeliveringChannel
from worker.queue.holdings import process_holdings, process_leases
from worker.queue.leases import LEASE_PREFIX, Leases, inflight_key
from worker.settings import get_settings

# Whether a take held back (its WAIT fell short) stands: 1 if the item is still in this holder's in-flight
# list, after a write (the holder's lease renewed) that a WAIT sent next covers, and with it the take.
# KEYS[1]: the in-flight list, KEYS[2]: the holder's lease. ARGV[1]: the item, ARGV[2]: the lease in ms.
_TAKE_STANDS = """
if not redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 1
"""


class DecidingChannel(DeliveringChannel):
    """The delivering channel, asking whether a held take stands before it takes anything else."""

    _deciding: tuple[str, bytes] | None = None  # a held take whose fate is asked on the wire
    _replicas_seen = 0  # how many replicas the primary had at the last take (ROLE): every WAIT asks for them all
    _in_poll: Any
    _brpop_sent_at: Any

    def _ask_whether_take_stands(self, leases: Leases, entry: tuple[str, bytes]) -> None:
        """Send _TAKE_STANDS for a take the replicas did not confirm, and a WAIT for them after it."""
        inflight, raw = entry
        settings = get_settings()
        lease_key, lease_ms = LEASE_PREFIX + leases.holder, int(leases.lease_s * 1000)
        timeout_ms = int(settings.redis_min_replicas_timeout_seconds * 1000)
        commands: list[list[Any]] = [
            ["EVAL", _TAKE_STANDS, 2, inflight, lease_key, raw, lease_ms],
            ["WAIT", max(settings.redis_min_replicas, self._replicas_seen), timeout_ms],
        ]
        connection = self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        self._deciding = entry
        connection.send_packed_command(connection.pack_commands(commands))

    def _read_decision(self, entry: tuple[str, bytes], **options: Any) -> bool:
        """Run a held take that stands once the replicas hold it; drop the copy of one that does not (the
        promoted primary never had it: it is back on its queue, or another worker's); ask again later
        while the replicas have not confirmed."""
        connection, holdings = self.client.connection, process_holdings()
        try:
            stands = self.client.parse_response(connection, "EVAL", **options)
        except redis.ResponseError as exc:
            self.client.parse_response(connection, "WAIT")
            kombu_redis.logger.warning("Could not ask whether a held take stands: %s", exc)
            raise Empty() from exc
        acked = self.client.parse_response(connection, "WAIT")
        if not stands:
            holdings.decided(*entry)
            kombu_redis.logger.warning("A take the replicas never confirmed was undone by a failover: not run")
            raise Empty()
        if acked < get_settings().redis_min_replicas:
            raise Empty()  # still not on the replicas: held, and asked again
        holdings.decided(*entry)
        self._deliver_taken(self.source_of(entry[0]), entry[1])
        return True

    def _hold_untrusted(self, reply: Any) -> None:
        inflight = inflight_key(process_leases(self).holder, bytes_to_str(reply[0]))
        process_holdings().untrusted(inflight, reply[1])
