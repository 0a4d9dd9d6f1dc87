"""A call's MCP upstream speaking to its caller: what the upstream sends during the call (worker/mcp_client/
relay.py) written to Redis for the gateway holding the caller's stream (worker/gateway/mcp/relay.py), and the
caller's answers to the upstream's requests read back:

    toolworker:call-events:<callId>              a stream, capped at EVENTS_MAXLEN, kept until the deadline
                                                 (and EVENTS_KEEP_S after): {"event": JSON} of kind progress
                                                 (progress, total, message), log (level, logger, data) or
                                                 request (id, method, params)
    toolworker:call-answer:<callId>:<request id> a list: the caller's result, as it gave it

Written only when the call's message says someone listens (`relay`, set by the gateway); never a secret (an
upstream's own words only).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis

from worker.protocol import call_answer_key, call_events_key

EVENTS_MAXLEN = 256
# How long the events outlive the call's deadline (a task's status message reads the last progress).
EVENTS_KEEP_S = 60
# One wait for an answer: short, so a Redis client's socket timeout never cuts a long deadline.
_WAIT_SLICE_S = 1.0


class CallEvents:
    """The listener of one call's upstream messages, through Redis (see the module)."""

    def __init__(self, redis: aioredis.Redis, call_id: str, deadline: float) -> None:
        self._redis = redis
        self._call_id = call_id
        self._deadline = deadline
        self._key = call_events_key(call_id)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self._add({"kind": "progress", "progress": progress, "total": total, "message": message})

    async def log(self, params: Mapping[str, Any]) -> None:
        await self._add({"kind": "log", **params})

    async def ask(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        request_id = secrets.token_urlsafe(12)
        await self._add({"kind": "request", "id": request_id, "method": method, "params": dict(params)})
        key = call_answer_key(self._call_id, request_id)
        while (left_s := self._deadline - time.time()) > 0:
            found = await self._redis.blpop([key], timeout=max(0.01, min(_WAIT_SLICE_S, left_s)))
            if found is not None:
                answer = json.loads(found[1])
                return answer if isinstance(answer, dict) else None
        return None

    async def _add(self, event: dict[str, Any]) -> None:
        keep_s = max(1, int(self._deadline - time.time()) + EVENTS_KEEP_S)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self._key, {"event": json.dumps(event, ensure_ascii=False)}, maxlen=EVENTS_MAXLEN)
            pipe.expire(self._key, keep_s)
            await pipe.execute()
