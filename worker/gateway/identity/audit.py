"""The audit trail: one record per call the gateway takes, and one per decision on a call parked for
approval (who decided, approve or deny, the reason), in a capped Redis stream and in the logs.

A record says when, who (principal, tenant), which tool, the callId, how it ended (exitCode; `pending`
when the gateway answered before the call did) and how long the gateway waited. It holds no argument,
header or token. Records written in the same loop tick share one round trip (XADD with MAXLEN ~, so the
stream stays near TOOLWORKER_AUDIT_STREAM_MAXLEN); a Redis that fails the write costs a log line, never
the call's answer. `toolworker audit` reads the stream back.

What an operator does (the console's sign-in, sign-out, purge and replay; the CLI's dead-letters purge
and replay) is recorded in the same stream as an Action: when, who, the action and what it named.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
import redis.asyncio as aioredis
import structlog
from redis.typing import EncodableT, FieldT

from worker.constants import AUDIT_STREAM_KEY

log = structlog.get_logger("toolworker.gateway.audit")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
READ_BATCH = 1000


@dataclass(frozen=True)
class Record:
    time: str  # when the gateway took the call (UTC, ISO 8601)
    principal: str
    tenant: str
    tool: str
    callId: str
    exitCode: int | None  # None: the gateway answered before the call ended
    durationMs: float

    def fields(self) -> dict[str, str]:
        return {k: "pending" if v is None else str(v) for k, v in vars(self).items()}


@dataclass(frozen=True)
class Action:
    time: str
    principal: str
    tenant: str
    action: str  # e.g. console.sign_in, dead_letter.purge
    target: str  # what it named (a dead letter's id), or ""
    detail: str = ""  # what the operator said (an approval's reason)

    def fields(self) -> dict[str, str]:
        return {k: str(v) for k, v in vars(self).items()}


def action(principal: str, tenant: str, name: str, target: str = "", detail: str = "") -> Action:
    return Action(now_iso(), principal, tenant, name, target, detail)


def write_action(client: redis.Redis, entry: Action, maxlen: int) -> None:
    """An action's record, written at once (the CLI)."""
    log.info("operator.action", **vars(entry))
    client.xadd(AUDIT_STREAM_KEY, stream_fields(entry), maxlen=maxlen, approximate=True)


@dataclass(frozen=True)
class Decision:
    """A human's decision on a call that needed approval (REST, the CLI, or asked through MCP)."""

    time: str
    principal: str  # who decided
    tenant: str  # the decider's
    tool: str
    callId: str
    decision: str  # approve | deny
    reason: str

    def fields(self) -> dict[str, str]:
        return dict(vars(self))


def stream_fields(entry: Record | Action | Decision) -> dict[FieldT, EncodableT]:
    """An entry's fields as XADD takes them (redis-py types them wider than the strings they are)."""
    return {name: value for name, value in entry.fields().items()}


class AuditTrail:
    def __init__(self, client: aioredis.Redis, maxlen: int) -> None:
        self._client = client
        self._maxlen = maxlen
        self._pending: list[Record | Action | Decision] = []
        self._flusher: asyncio.Task[None] | None = None

    def record(self, entry: Record | Action | Decision) -> None:
        log.info(_EVENTS[type(entry)], **vars(entry))  # every field a scalar: no deep copy
        self._pending.append(entry)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def drain(self) -> None:
        """Until every record so far is written (at shutdown)."""
        while self._flusher is not None:
            await self._flusher

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the records of this tick join
        batch, self._pending = self._pending, []
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for entry in batch:
                    pipe.xadd(AUDIT_STREAM_KEY, stream_fields(entry), maxlen=self._maxlen, approximate=True)
                await pipe.execute()
        except Exception as exc:  # the log line above is the record of last resort
            log.warning("gateway.audit_not_written", records=len(batch), error=str(exc))
        finally:
            self._flusher = None
            if self._pending:
                self._flusher = asyncio.get_running_loop().create_task(self._flush())


_EVENTS = {Record: "gateway.call", Action: "operator.action", Decision: "gateway.decision"}


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def since_ms(text: str, now: datetime | None = None) -> int:
    """A `--since` value as a stream id's milliseconds: ISO 8601 (UTC when no zone), or `30s`/`15m`/`2h`/`7d`
    ago."""
    now = now or datetime.now(UTC)
    relative = _RELATIVE.match(text.strip())
    if relative:
        moment = now - timedelta(seconds=float(relative.group(1)) * _UNIT_S[relative.group(2)])
    else:
        try:
            moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"--since takes an ISO 8601 time or an age like 15m, 2h, 7d; not {text!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def read(client: redis.Redis, principal: str | None = None, start_ms: int = 0) -> Iterator[dict[str, Any]]:
    """The stream's records from `start_ms` on, oldest first (of one principal when named)."""
    start = f"{start_ms}-0"
    while True:
        entries: list[Any] = client.xrange(AUDIT_STREAM_KEY, min=start, max="+", count=READ_BATCH) or []
        for entry_id, raw in entries:
            fields = {_text(k): _text(v) for k, v in raw.items()}
            if principal is None or fields.get("principal") == principal:
                yield {"id": _text(entry_id), **fields}
        if len(entries) < READ_BATCH:
            return
        start = "(" + _text(entries[-1][0])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
