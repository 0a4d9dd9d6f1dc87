"""Reading the result store: the envelope published for a call, read on the shard the call went to (or on
every shard, for a call sent by another client), once within a bound or polled until a deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis

from worker.client.routing import Link, Routing
from worker.constants import CLIENT_SLACK_S, RESULT_KEY_PREFIX
from worker.envelope import ToolResult
from worker.protocol import envelope_from_meta


async def stored_envelope(client: aioredis.Redis, call_id: str) -> dict[str, Any] | None:
    """The envelope published for a call, None while there is none (kept for the TTL)."""
    raw = await client.get(RESULT_KEY_PREFIX + call_id)
    return None if raw is None else envelope_from_meta(raw)


async def _stored_on(link: Link, call_ids: list[str]) -> list[dict[str, Any] | None]:
    return list(await asyncio.gather(*(stored_envelope(link.redis, call_id) for call_id in call_ids)))


class StoredResults:
    """Envelopes read from the result store, each within a bound (else RedisLost naming the shard)."""

    def __init__(self, routing: Routing) -> None:
        self._routing = routing

    async def many(self, call_ids: list[str], timeout_s: float, doing: str) -> list[dict[str, Any] | None]:
        """The stored envelopes of these calls, read within `timeout_s` from the shard each went to (else
        RedisLost naming it); calls not sent from here are looked for on every shard."""
        by_link: dict[Link | None, list[str]] = {}
        for call_id in call_ids:
            by_link.setdefault(self._routing.sent_to.get(call_id), []).append(call_id)
        found: dict[str, dict[str, Any] | None] = {}
        for link, ids in by_link.items():
            if link is None:
                found |= await self._anywhere(ids, timeout_s, doing)
            else:
                found |= zip(
                    ids, await self._routing.bounded(_stored_on(link, ids), timeout_s, doing, link), strict=True
                )
        return [found[call_id] for call_id in call_ids]

    async def one(self, call_id: str, timeout_s: float) -> dict[str, Any] | None:
        return (await self.many([call_id], timeout_s, f"while waiting for the result of call {call_id}"))[0]

    async def poll(self, call_id: str, timeout: float) -> ToolResult:
        """The envelope of a call read again and again (backing off to 0.5 s) until it is there or `timeout` ends."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            left_s = max(0.0, deadline - time.monotonic())
            envelope = await self.one(call_id, left_s + CLIENT_SLACK_S)
            if envelope is not None:
                return ToolResult.from_dict(envelope)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no result for call {call_id} within {timeout:g} s")
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)

    async def _anywhere(self, call_ids: list[str], timeout_s: float, doing: str) -> dict[str, Any]:
        """Envelopes looked for on every shard at once: a shard that does not answer is passed over (its
        calls look unanswered) unless none answers."""
        links = list(self._routing.links.values())
        reads = (self._routing.bounded(_stored_on(link, call_ids), timeout_s, doing, link) for link in links)
        outcomes = await asyncio.gather(*reads, return_exceptions=True)
        answers = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
        if not answers:
            raise next(outcome for outcome in outcomes if isinstance(outcome, BaseException))
        by_call = zip(call_ids, *answers, strict=True)
        return {call_id: next(filter(None, envelopes), None) for call_id, *envelopes in by_call}
