"""The dead-letter list as operators read it: list, show, purge and replay one item, named by a stable id.

    toolcall:dead-letter                       LIST of JSON records, newest first (dead_letter.py writes them)
    toolcall:dead-letter:replayed:<id>         SET NX before a replay: two operators (or two clicks) replaying
                                               the same item enqueue it once

An item is named by its `id`; a record written before records had one is named by the digest of its text
(`sha-...`), which stays the same as long as the record does. Purge removes exactly that record (LREM of
its text, count 1), never "the Nth": the list moves while an operator reads it.

Replay is by the record's `kind`, through REPLAYERS: `message` (what the workers dead-letter) holds calls
when the message did; each is enqueued again with its callId (the header values were never kept: the
call goes without its own headers), unless its callId already has an envelope (a call is answered once).
Another kind (a webhook delivery) registers its own Replayer under its kind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import redis.asyncio as aioredis

from worker.constants import DEAD_LETTER_KEY, DEFAULT_TENANT, RESULT_KEY_PREFIX
from worker.protocol import url_origin
from worker.queue import webhooks

REPLAYED_PREFIX = DEAD_LETTER_KEY + ":replayed:"
REPLAYED_TTL_S = 7 * 86_400
# A record's kind when it names none: a message the workers refused.
MESSAGE_KIND = "message"
WEBHOOK_KIND = "webhook"
DEFAULT_REPLAY_TIMEOUT_S = 60.0


class DeadLetterError(Exception):
    """Why an item cannot be purged or replayed (the message is for an operator)."""


class NoSuchItem(DeadLetterError):
    pass


class NotReplayable(DeadLetterError):
    pass


@dataclass(frozen=True)
class DeadLetter:
    id: str
    entry: Mapping[str, Any]  # the record as stored: already redacted
    raw: bytes  # the list element, to remove exactly it

    @property
    def reason(self) -> str:
        return str(self.entry.get("reason", ""))

    @property
    def when(self) -> str:
        at = self.entry.get("at")
        return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds") if isinstance(at, int | float) else ""

    @property
    def kind(self) -> str:
        return str(self.entry.get("kind") or MESSAGE_KIND)

    @property
    def replayable(self) -> bool:
        replayer = REPLAYERS.get(self.kind)
        return replayer is not None and replayer.holds(self)

    def shown(self) -> dict[str, Any]:
        """The record for a page or a terminal, with its id (it holds no secret: header values were never kept,
        and a webhook's URL, whose path or query may hold the receiver's token, shows its origin only)."""
        shown = {"id": self.id, **{k: v for k, v in self.entry.items() if k != "id"}}
        if self.kind == WEBHOOK_KIND and isinstance(shown.get("url"), str):
            shown["url"] = url_origin(shown["url"])
        return shown


def item_id(raw: bytes, entry: Mapping[str, Any]) -> str:
    given = entry.get("id")
    return given if isinstance(given, str) and given else "sha-" + hashlib.sha256(raw).hexdigest()[:24]


def _parse(raw: bytes) -> DeadLetter:
    try:
        entry = json.loads(raw)
    except ValueError:
        entry = None
    entry = entry if isinstance(entry, dict) else {"reason": "(an unreadable record)"}
    return DeadLetter(item_id(raw, entry), entry, raw)


# --- replaying --------------------------------------------------------------------------------------

# Enqueues one call again: (tool, arguments, callId, tenant, principal, timeout_s). The caller (the gateway,
# the CLI) brings its client: this module sits below the client in the tree.
Enqueue = Callable[[str, dict[str, Any], str, str, str | None, float], Awaitable[None]]


@dataclass(frozen=True)
class ReplayContext:
    redis: aioredis.Redis
    enqueue: Enqueue


class Replayer(Protocol):
    def holds(self, letter: DeadLetter) -> bool:
        """Whether the item holds something to replay."""
        ...

    async def replay(self, letter: DeadLetter, context: ReplayContext) -> str:
        """Replay it; returns what was done, for the operator. Raises NotReplayable."""
        ...


class CallReplayer:
    """A refused message's calls, enqueued again with their callIds: each answered once."""

    def holds(self, letter: DeadLetter) -> bool:
        calls = letter.entry.get("calls")
        return isinstance(calls, list) and bool(calls) and all(_call_id(c) for c in calls)

    async def replay(self, letter: DeadLetter, context: ReplayContext) -> str:
        calls: list[dict[str, Any]] = list(letter.entry["calls"])
        ids = [_call_id(call) for call in calls]
        flags = await context.redis.mget([RESULT_KEY_PREFIX + i for i in ids])
        answered = [i for i, done in zip(ids, flags, strict=True) if done]
        if answered:
            raise NotReplayable(f"already answered: {', '.join(answered)} (a call is answered once)")
        for call in calls:
            arguments, tenant, principal = call.get("arguments"), call.get("tenant"), call.get("principal")
            arguments = arguments if isinstance(arguments, dict) else {}
            tenant = tenant if isinstance(tenant, str) else DEFAULT_TENANT
            principal = principal if isinstance(principal, str) else None
            timeout = call.get("timeoutSeconds")
            timeout_s = float(timeout) if isinstance(timeout, int | float) and timeout > 0 else DEFAULT_REPLAY_TIMEOUT_S
            await context.enqueue(str(call["tool"]), arguments, _call_id(call), tenant, principal, timeout_s)
        return f"enqueued again: {', '.join(ids)}"


def _call_id(call: Any) -> str:
    call_id = call.get("callId") if isinstance(call, dict) else None
    return call_id if isinstance(call_id, str) and call_id else ""


class DeliveryReplayer:
    """A webhook delivery given up: due again from a new record, with the same webhook-id and a new retry
    window (webhooks.py), so the receiver can tell it from a new one."""

    def holds(self, letter: DeadLetter) -> bool:
        return all(isinstance(letter.entry.get(key), str) for key in ("callId", "url", "webhookId", "envelope"))

    async def replay(self, letter: DeadLetter, context: ReplayContext) -> str:
        await webhooks.requeue(context.redis, letter.entry)
        return f"delivery of {letter.entry['callId']} due again ({letter.entry['webhookId']})"


# kind -> how to replay it.
REPLAYERS: dict[str, Replayer] = {MESSAGE_KIND: CallReplayer(), WEBHOOK_KIND: DeliveryReplayer()}


# --- the list ---------------------------------------------------------------------------------------


class DeadLetters:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def items(self) -> list[DeadLetter]:
        """Every item, newest first."""
        raws: list[Any] = await self._redis.lrange(DEAD_LETTER_KEY, 0, -1)
        return [_parse(raw if isinstance(raw, bytes) else raw.encode()) for raw in raws]

    async def get(self, wanted: str) -> DeadLetter:
        for letter in await self.items():
            if letter.id == wanted:
                return letter
        raise NoSuchItem(f"no dead letter {wanted!r} (purged, replayed, or never there)")

    async def purge(self, wanted: str) -> DeadLetter:
        """Remove exactly that item; raises NoSuchItem (someone else removed it first)."""
        letter = await self.get(wanted)
        removed: int = await self._redis.lrem(DEAD_LETTER_KEY, 1, letter.raw)  # type: ignore[arg-type]  # typed str, sent as bytes
        if not removed:
            raise NoSuchItem(f"no dead letter {wanted!r} (removed meanwhile)")
        return letter

    async def replay(self, wanted: str, enqueue: Enqueue) -> str:
        """Replay the item once (and remove it from the list); raises NoSuchItem, NotReplayable."""
        letter = await self.get(wanted)
        replayer = REPLAYERS.get(letter.kind)
        if replayer is None or not replayer.holds(letter):
            raise NotReplayable(f"dead letter {wanted!r} holds nothing to replay ({letter.reason})")
        marker = REPLAYED_PREFIX + letter.id
        if not await self._redis.set(marker, "1", nx=True, ex=REPLAYED_TTL_S):
            raise NotReplayable(f"dead letter {wanted!r} was replayed already")
        try:
            done = await replayer.replay(letter, ReplayContext(self._redis, enqueue))
        except BaseException:
            await self._redis.delete(marker)  # nothing enqueued: it may be tried again
            raise
        await self._redis.lrem(DEAD_LETTER_KEY, 1, letter.raw)  # type: ignore[arg-type]  # (as in purge)
        return done
