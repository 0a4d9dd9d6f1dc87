"""Claims on callIds: the gateway's own Redis keys (`toolworker:gateway:call:<callId>`).

A call is claimed before it is enqueued; the claim holds the call's fingerprint, its tool and the name of
the principal that made it (only that principal, or one with the `operate` grant, may read or withdraw
it), and lives as long as results do. A claim that exists already means the call was enqueued before (perhaps by another
gateway process): it is not enqueued again. Claims made in the same loop tick share one round trip.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import redis.asyncio as aioredis

from worker.constants import GATEWAY_CALL_KEY_PREFIX


@dataclass(frozen=True)
class Claim:
    fingerprint: str
    tool: str
    # The principal's name; last, as it may hold spaces (fingerprints and tool names never do).
    owner: str = ""

    def encode(self) -> str:
        return f"{self.fingerprint} {self.tool} {self.owner}"

    @classmethod
    def decode(cls, value: bytes | str) -> Claim:
        text = value.decode() if isinstance(value, bytes) else value
        fingerprint, _, rest = text.partition(" ")
        tool, _, owner = rest.partition(" ")
        return cls(fingerprint, tool, owner)


class Claims:
    def __init__(self, client: aioredis.Redis, ttl_s: int) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._pending: list[tuple[str, Claim, asyncio.Future[Claim | None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def claim(self, call_id: str, claim: Claim) -> Claim | None:
        """None when the callId is now this call's; else the claim it already had."""
        future: asyncio.Future[Claim | None] = asyncio.get_running_loop().create_future()
        self._pending.append((call_id, claim, future))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def get(self, call_id: str) -> Claim | None:
        value = await self._client.get(GATEWAY_CALL_KEY_PREFIX + call_id)
        return None if value is None else Claim.decode(value)

    async def release(self, call_id: str) -> None:
        await self._client.delete(GATEWAY_CALL_KEY_PREFIX + call_id)

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the claims of this tick join
        batch, self._pending, self._flusher = self._pending, [], None
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for call_id, claim, _ in batch:
                    key = GATEWAY_CALL_KEY_PREFIX + call_id
                    pipe.set(key, claim.encode(), nx=True, ex=self._ttl_s)
                    pipe.get(key)
                replies = await pipe.execute()
        except Exception as exc:  # every waiting claim sees the failure
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for index, (_, _, future) in enumerate(batch):
            created, value = replies[2 * index], replies[2 * index + 1]
            if not future.done():
                future.set_result(None if created or value is None else Claim.decode(value))
