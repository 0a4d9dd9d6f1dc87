"""Webhooks: a call's envelope POSTed to its `callback.url`, signed per Standard Webhooks, from a durable record.

    record    written by the publisher's script in the same step as the result (worker/queue/publisher.py):
              HSET toolworker:webhook:<callId> url id body first attempts, ZADD toolworker:webhooks:due
    claim     any worker process: the due entries (score <= now) are pushed to now + a claim, one script;
              the new score is the claim's fence. A worker killed mid-delivery leaves its entries to come
              due again when the claim lapses, and another delivers them with the same webhook-id.
    deliver   POST the envelope with webhook-id, webhook-timestamp, webhook-signature (one `v1,<base64
              HMAC-SHA256 of id.timestamp.body>` per secret, space-separated); any 2xx is delivered:
              record and entry deleted
    retry     otherwise due again after an exponential backoff with jitter, while the next attempt falls
              within TOOLWORKER_CALLBACK_RETRY_SECONDS of the publication
    give up   the record becomes a dead letter (`kind: "webhook"`, the reason, all a replay needs), one step

Callback hosts pass TOOLWORKER_CALLBACK_ALLOW (the egress allow-list's syntax) when a call is enqueued
(`check_callback`) and again when it is taken; every connection passes the egress policy's address check
against the same list (worker/http/egress.py). Delivery is at least once: a receiver dedupes on webhook-id.

This module owns its Redis keys (RECORD_PREFIX, DUE_KEY).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis
import structlog
from yarl import URL

from worker import errors
from worker.constants import DEAD_LETTER_KEY, DEAD_LETTER_MAX
from worker.http.egress import EgressPolicy, check_callback
from worker.http.transport import HttpTransport, Limits, PoolSpec, PreparedRequest

log = structlog.get_logger("toolworker.webhooks")

RECORD_PREFIX = "toolworker:webhook:"
DUE_KEY = "toolworker:webhooks:due"
SIGNATURE_HEADER = "webhook-signature"
_HEADER_SAFE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_FIRST_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 300.0
_CLAIM_MARGIN_S = 5.0
_POLL_S = 1.0
_MAX_IN_FLIGHT = 256
_RESPONSE_BYTES = 64 * 1024
_POOL_CONNECTIONS = 100

# KEYS: the due set. ARGV: now (ms), claim (ms), at most this many, the record prefix. Answers the fence and,
# for each claimed id, the id and its record's fields (none when it is gone).
_CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
local until_ms = tonumber(ARGV[1]) + tonumber(ARGV[2])
local claimed = {}
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], until_ms, id)
  claimed[#claimed + 1] = {id, redis.call('HGETALL', ARGV[4] .. id)}
end
return {until_ms, claimed}
"""
# KEYS: the due set, the record. ARGV: the id, the fence, the next due time (ms).
_RETRY = """
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) ~= tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[2], 'attempts', 1)
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""
# KEYS: the due set, the record, the dead letters. ARGV: the id, the fence, the letter, the list's cap.
_GIVE_UP = """
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('LPUSH', KEYS[3], ARGV[3])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
return 1
"""


def webhook_id(call_id: str) -> str:
    """The webhook-id of a call's delivery, the same at every attempt: `msg_<callId>` when the callId is
    header-safe, else `msg_` and the first 32 hex digits of its SHA-256."""
    if _HEADER_SAFE_ID.fullmatch(call_id):
        return f"msg_{call_id}"
    return "msg_" + hashlib.sha256(call_id.encode()).hexdigest()[:32]


def sign(keys: list[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature header: `v1,<base64 HMAC-SHA256 of id.timestamp.body>` per key, space-separated."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return " ".join("v1," + base64.b64encode(hmac.new(k, signed, hashlib.sha256).digest()).decode() for k in keys)


def record_key(call_id: str) -> str:
    return RECORD_PREFIX + call_id


def backoff_s(attempts: int) -> float:
    """The wait after the `attempts`-th failure: doubling from 1 s up to 5 min, with half of it jittered."""
    ceiling: float = min(_MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2.0 ** (attempts - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A durable record, as claimed."""

    call_id: str
    url: str
    message_id: str
    body: bytes
    first_ms: int
    attempts: int

    def letter(self, reason: str) -> str:
        """The dead letter of a delivery given up: what `requeue` (a replay) needs, and no secret."""
        return json.dumps(
            {
                "kind": "webhook",
                "reason": reason,
                "callId": self.call_id,
                "url": self.url,
                "webhookId": self.message_id,
                "attempts": self.attempts,
                "firstAttemptAt": self.first_ms / 1000,
                "envelope": self.body.decode(),
                "at": time.time(),
            },
            ensure_ascii=False,
        )


async def requeue(client: aioredis.Redis, letter: Mapping[str, Any]) -> None:
    """Deliver a dead-lettered webhook again (a replay): its record back, due now, the same webhook-id, a
    new retry window."""
    now_ms = int(time.time() * 1000)
    fields: dict[Any, Any] = {
        "url": str(letter["url"]),
        "id": str(letter["webhookId"]),
        "body": str(letter["envelope"]),
        "first": now_ms,
        "attempts": 0,
    }
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(record_key(letter["callId"]), mapping=fields)
        pipe.zadd(DUE_KEY, {letter["callId"]: now_ms})
        await pipe.execute()


class Deliveries:
    """One worker process's deliveries: claims what is due, posts it, retries or gives up."""

    def __init__(
        self,
        client: aioredis.Redis,
        policy: EgressPolicy,
        keys: list[bytes],
        retry_s: float,
        timeout_s: float,
        dns_servers: list[str] | None = None,
    ) -> None:
        self.client = client
        self.policy = policy
        self._keys = keys
        self._retry_ms = int(retry_s * 1000)
        self._timeout_s = timeout_s
        self._claim_ms = int((timeout_s + _CLAIM_MARGIN_S) * 1000)
        self._transport = HttpTransport(policy, dns_servers)
        self._spec = PoolSpec("(callbacks)", True, _POOL_CONNECTIONS, timeout_s)
        self._limits = Limits(_RESPONSE_BYTES, min(timeout_s, 5.0))
        self._wake = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()
        # Deliveries made in the same loop tick have their records deleted together.
        self._delivered_ids: list[str] = []
        self._settled: asyncio.Future[None] | None = None
        self._settling: asyncio.Task[None] | None = None  # referenced: a bare task may be collected
        self._scripts = {name: client.register_script(text) for name, text in _SCRIPTS.items()}

    def wake(self) -> None:
        """A record was just written: claim it now rather than at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled: claim what is due while there is room, deliver each on a task of its own, wait
        for the next wake (a record written, a delivery over) or poll."""
        while True:
            self._wake.clear()
            room = _MAX_IN_FLIGHT - len(self._in_flight)
            try:
                claimed = await self.claim_due(room) if room > 0 else []
            except Exception as exc:  # Redis away: the records wait in Redis, nothing is lost
                log.warning("webhook.claim_failed", error=f"{type(exc).__name__}: {str(exc)[:200]}")
                claimed = []
            for call_id, fence, delivery in claimed:
                task = asyncio.get_running_loop().create_task(self._guarded(call_id, fence, delivery))
                self._in_flight.add(task)  # referenced: a bare task may be collected
                task.add_done_callback(self._over)
            if len(claimed) < room or room <= 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _POLL_S)

    def _over(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._wake.set()

    async def claim_due(self, most: int) -> list[tuple[str, int, Delivery | None]]:
        """Claim at most `most` due deliveries: (callId, fence, its record or None when it is gone) each."""
        args: list[Any] = [int(time.time() * 1000), self._claim_ms, most, RECORD_PREFIX]
        fence, claimed = await self._scripts["claim"](keys=[DUE_KEY], args=args)
        found = []
        for raw_id, flat in claimed:
            call_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            found.append((call_id, int(fence), _delivery(call_id, dict(zip(flat[::2], flat[1::2], strict=True)))))
        return found

    async def close(self) -> None:
        for task in list(self._in_flight):  # their records stay claimed, and come due again after the claim
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        await self._transport.close()

    async def _guarded(self, call_id: str, fence: int, delivery: Delivery | None) -> None:
        try:
            await self._deliver(call_id, fence, delivery)
        except Exception as exc:  # Redis lost mid-way: the claim lapses and the delivery comes due again
            log.warning("webhook.delivery_interrupted", callId=call_id, error=f"{type(exc).__name__}: {str(exc)[:200]}")

    async def _deliver(self, call_id: str, fence: int, delivery: Delivery | None) -> None:
        if delivery is None:  # delivered by another worker meanwhile (or replaced): nothing to do
            await self.client.zrem(DUE_KEY, call_id)
            return
        now_ms = int(time.time() * 1000)
        if delivery.attempts and now_ms > delivery.first_ms + self._retry_ms:  # the fleet was away too long
            await self._give_up(delivery, fence, "the retry window passed before the next attempt")
            return
        try:
            check_callback(self.policy, delivery.url)
            status = await self._post(delivery)
        except errors.ToolError as exc:
            await self._failed(delivery, fence, exc.message, permanent=isinstance(exc, errors.EgressBlocked))
            return
        if 200 <= status < 300:
            await self._delivered(delivery)
        else:
            await self._failed(delivery, fence, f"the receiver answered HTTP {status}", permanent=False)

    async def _post(self, delivery: Delivery) -> int:
        """One attempt; the receiver's status, or the ToolError that stopped it."""
        timestamp = int(time.time())
        headers = (
            ("Content-Type", "application/json"),
            ("webhook-id", delivery.message_id),
            ("webhook-timestamp", str(timestamp)),
            (SIGNATURE_HEADER, sign(self._keys, delivery.message_id, timestamp, delivery.body)),
        )
        request = PreparedRequest(
            "POST", str(URL(delivery.url)), headers, delivery.body, frozenset(), frozenset({SIGNATURE_HEADER})
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._transport.send(request, self._spec, self._limits, _no_redirect, None)
        except TimeoutError:
            raise errors.TimedOut(f"The receiver did not answer within {self._timeout_s:g} s.") from None
        return response.status

    async def _delivered(self, delivery: Delivery) -> None:
        """Delete the record; deliveries over in the same loop tick share one round trip."""
        if self._settled is None:
            self._settled = asyncio.get_running_loop().create_future()
            self._settling = asyncio.get_running_loop().create_task(self._settle())
        self._delivered_ids.append(delivery.call_id)
        await asyncio.shield(self._settled)
        log.info("webhook.delivered", callId=delivery.call_id, webhookId=delivery.message_id, host=_host(delivery))

    async def _settle(self) -> None:
        await asyncio.sleep(0)
        ids, self._delivered_ids = self._delivered_ids, []
        settled, self._settled = self._settled, None
        assert settled is not None
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.zrem(DUE_KEY, *ids)
                pipe.delete(*(record_key(call_id) for call_id in ids))
                await pipe.execute()
        except Exception as exc:  # each delivery's task sees it (its claim lapses: delivered again)
            settled.set_exception(exc)
        else:
            settled.set_result(None)

    async def _failed(self, delivery: Delivery, fence: int, reason: str, permanent: bool) -> None:
        attempts = delivery.attempts + 1
        next_ms = int(time.time() * 1000 + backoff_s(attempts) * 1000)
        log.warning("webhook.attempt_failed", callId=delivery.call_id, attempt=attempts, reason=reason)
        if permanent or next_ms > delivery.first_ms + self._retry_ms:
            why = reason if permanent else f"{reason} (after {attempts} attempts, the retry window is over)"
            await self._give_up(replace(delivery, attempts=attempts), fence, why)
            return
        await self._scripts["retry"](
            keys=[DUE_KEY, record_key(delivery.call_id)], args=[delivery.call_id, fence, next_ms]
        )

    async def _give_up(self, delivery: Delivery, fence: int, reason: str) -> None:
        keys = [DUE_KEY, record_key(delivery.call_id), DEAD_LETTER_KEY]
        given_up = await self._scripts["give_up"](
            keys=keys, args=[delivery.call_id, fence, delivery.letter(reason), DEAD_LETTER_MAX]
        )
        if given_up:
            log.warning("webhook.dead_lettered", callId=delivery.call_id, host=_host(delivery), reason=reason)


_SCRIPTS = {"claim": _CLAIM, "retry": _RETRY, "give_up": _GIVE_UP}


def _delivery(call_id: str, fields: dict[bytes, bytes]) -> Delivery | None:
    """A record as read; None when it is gone (delivered by another worker meanwhile)."""
    if not fields:
        return None
    return Delivery(
        call_id=call_id,
        url=fields[b"url"].decode(),
        message_id=fields[b"id"].decode(),
        body=fields[b"body"],
        first_ms=int(fields[b"first"]),
        attempts=int(fields.get(b"attempts", 0)),
    )


def _no_redirect(target: URL) -> None:
    raise errors.EgressBlocked("The receiver answered with a redirect; callbacks are not redirected.")


def _host(delivery: Delivery) -> str:
    """What the log says of a callback URL: its host, never its path or query (they may hold a token)."""
    return URL(delivery.url).host or "?"
