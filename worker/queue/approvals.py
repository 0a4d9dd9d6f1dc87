"""Calls parked for a human's approval (SPEC 13, docs/guides/approvals.md).

A worker that takes a call whose tool needs approval (`model.needs_approval`), and that nobody approved,
parks it instead of running it: the call goes into a Redis hash and its message is acknowledged, so it
holds no worker slot and outlives any process. A principal with the `approve` grant decides (`decide`):
approved, the call is pushed back onto its tenant's queue in the transaction that marks it approved (a
double click or two gateways deciding at once push it once: the second finds it decided); denied, it is
answered with an envelope (77). The workers' sweeper answers the calls nobody decided in time (75). Over
MCP the human is asked through the client, and the gateway records the approval before it enqueues
(`grant`).

    toolworker:approval:<callId>   HASH  state, the call as its message held it, who and what (for the
                                         list), since, expires, decidedBy, reason; kept for the approval
                                         TTL plus the result TTL
    toolworker:approvals           ZSET  callId -> when to look at it again: a parked call's expiry; 0 for
                                         one denied whose envelope is still to be published

States: parked -> approved -> started (a worker claimed it: it runs once) | denied | expired. The
message of a started call delivered again (its worker was lost mid-call) is not run again: it is
answered 70, since the call may have reached the upstream. The parked hash holds what the queue's
message held (call header values included as the queue holds them: sealed, with vault keys); every list
shows header names only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import redis.asyncio as aioredis
import structlog

from worker import errors
from worker.call.admission import call_deadline
from worker.call.runtime import Runtime
from worker.constants import DEFAULT_QUEUE, DEFAULT_TENANT, MAX_CALL_TIMEOUT_S, REDACTED
from worker.definitions.model import Tool, Upstream, needs_approval
from worker.definitions.templates import Arg
from worker.envelope import ToolResult
from worker.protocol import ToolCall, task_message
from worker.queue import scheduler
from worker.queue.publisher import Publisher

log = structlog.get_logger("toolworker.approvals")

APPROVAL_KEY_PREFIX = "toolworker:approval:"
APPROVALS_KEY = "toolworker:approvals"
PARKED, APPROVED, STARTED, DENIED, EXPIRED = "parked", "approved", "started", "denied", "expired"
SWEEP_EVERY_S = 1.0
SWEEP_BATCH = 100
MAX_LISTED = 1000
Decision = Literal["approve", "deny"]
# What `Gate.hold` says of a call it parked (no envelope yet).
PARKED_NOW: Literal["parked"] = "parked"

# KEYS: the call's hash, the index. ARGV: callId, expires (s), the hash's ttl (s), field, value, ...
# A call seen for the first time is parked (nil); an approved one is claimed, to start once.
_ADMIT = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], 'state', 'parked', unpack(ARGV, 4))
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  return false
end
if state == 'approved' then redis.call('HSET', KEYS[1], 'state', 'started') end
return state
"""
# KEYS: the call's hash. ARGV: the hash's ttl (s), field, value, ... An approval given before the call is
# enqueued (MCP); nil when given, else the call's state.
_GRANT = """
local state = redis.call('HGET', KEYS[1], 'state')
if state then return state end
redis.call('HSET', KEYS[1], 'state', 'approved', unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return false
"""
# KEYS: the call's hash. A parked call whose time is up expires; the state it is in after.
_DUE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'parked' then
  redis.call('HSET', KEYS[1], 'state', 'expired')
  return 'expired'
end
return state
"""


class NotParked(LookupError):
    """The call is not waiting for a decision: unknown (`state` None) or decided already."""

    def __init__(self, call_id: str, state: str | None) -> None:
        what = "is not known" if state is None else f"is not waiting for a decision (it is {state})"
        super().__init__(f"The call {call_id!r} {what}.")
        self.call_id, self.state = call_id, state


@dataclass(frozen=True)
class ParkedCall:
    """A call's approval record as Redis holds it."""

    call_id: str
    fields: Mapping[str, str]

    @property
    def state(self) -> str:
        return self.fields.get("state", "")

    @property
    def call(self) -> dict[str, Any]:
        """The call object as its message held it."""
        value: dict[str, Any] = json.loads(self.fields.get("call") or "{}")
        return value

    def listing(self) -> dict[str, Any]:
        """What a list shows: who, what, since when, until when; header values never."""
        call, fields = self.call, self.fields
        return {
            "callId": self.call_id,
            "tool": fields.get("tool", ""),
            "principal": fields.get("principal") or None,
            "tenant": fields.get("tenant", ""),
            "method": fields.get("method", ""),
            "target": fields.get("target", ""),
            "arguments": call.get("arguments", {}),
            "headers": dict.fromkeys(call.get("headers") or {}, REDACTED),
            "since": _iso(fields.get("since")),
            "expires": _iso(fields.get("expires")),
        }

    def refusal(self) -> ToolResult:
        """The envelope of a call denied or expired (never sent)."""
        tool, reason = self.fields.get("tool", "?"), self.fields.get("reason", "")
        if self.state == DENIED:
            who = self.fields.get("decidedBy", "?")
            text = f"A human ({who}) denied this call; it was not sent." + (f" Reason: {reason}" if reason else "")
            return ToolResult.failure(self.call_id, tool, errors.ApprovalDenied(text))
        text = "Nobody approved this call in time; it was not sent. Ask again if it is still needed."
        return ToolResult.failure(self.call_id, tool, errors.ApprovalExpired(text))


def approval_key(call_id: str) -> str:
    return APPROVAL_KEY_PREFIX + call_id


def target(tool: Tool, upstream: Upstream, arguments: Mapping[str, Any]) -> str:
    """A redacted summary of where the call goes: method, upstream, path with its arguments (never an
    `${env:...}` value)."""
    parts = [
        p if isinstance(p, str) else str(arguments.get(p.name, "")) if isinstance(p, Arg) else REDACTED
        for p in tool.request.path.parts
    ]
    return f"{tool.request.method} {upstream.name} {''.join(parts) or '/'}"


def describe(
    call: Mapping[str, Any], tool: Tool, upstream: Upstream, tenant: str, principal: str | None
) -> dict[str, str]:
    """The fields of an approval record for this call (the hash's, besides state)."""
    return {
        "call": json.dumps(call, ensure_ascii=False),
        "tool": tool.name,
        "tenant": tenant,
        "principal": principal or "",
        "method": tool.request.method,
        "target": target(tool, upstream, call.get("arguments") or {}),
        "queue": upstream.queue or DEFAULT_QUEUE,
        "since": repr(time.time()),
    }


class Gate:
    """At the worker: whether a call may run now, or waits for a decision (parked), or was refused."""

    def __init__(self, client: aioredis.Redis, runtime: Runtime, ttl_s: int, keep_s: int) -> None:
        self.client, self.runtime, self.ttl_s, self.keep_s = client, runtime, ttl_s, keep_s

    def _rule(self, call: ToolCall) -> tuple[Tool, Upstream] | None:
        """The call's tool when it needs approval; None otherwise (an unknown tool is run_call's to answer)."""
        try:
            tool, upstream = self.runtime.resolve(call.tool)
        except errors.ToolError:
            return None
        return (tool, upstream) if needs_approval(tool, upstream) else None

    async def hold(self, call: ToolCall, received_at: float) -> ToolResult | Literal["parked"] | None:
        """None: run it now (it needs no approval, or it is approved and now claimed); PARKED_NOW: it waits;
        an envelope: it was refused (denied, expired, or started before by a worker that was lost)."""
        rule = self._rule(call)
        if rule is None:
            return None
        try:  # a call that cannot run anyway is answered at once, not parked
            call_deadline(call, received_at)
            self.runtime.arguments_schema(rule[0]).check(call.arguments)
        except errors.ToolError:
            return None
        return await self._admit(call, *rule)

    async def _admit(self, call: ToolCall, tool: Tool, upstream: Upstream) -> ToolResult | Literal["parked"] | None:
        expires = time.time() + self.ttl_s
        message = call.model_dump(mode="json", by_alias=True, exclude_none=True)
        fields = describe(message, tool, upstream, call.tenant, call.principal)
        fields["expires"] = repr(expires)
        fields["replyTo"] = call.reply_to or ""
        flat = [item for pair in fields.items() for item in pair]
        key = approval_key(call.call_id)
        state: Any = await self.client.eval(
            _ADMIT, 2, key, APPROVALS_KEY, call.call_id, expires, self.ttl_s + self.keep_s, *flat
        )
        state = state.decode() if isinstance(state, bytes) else state
        if state is None or state == PARKED:
            log.info("call.parked", callId=call.call_id, tool=call.tool, new=state is None)
            return PARKED_NOW
        if state == APPROVED:
            return None
        if state == STARTED:
            error = errors.InternalError(
                "The worker running this approved call was lost; the call may have reached the upstream, "
                "so it was not sent again. Ask for approval again if it did not happen."
            )
            return ToolResult.failure(call.call_id, call.tool, error)
        return ParkedCall(call.call_id, await _fields(self.client, key)).refusal()


async def grant(client: aioredis.Redis, call_id: str, fields: Mapping[str, str], keep_s: int) -> bool:
    """Record an approval given before the call is enqueued (a human asked through MCP); False when the
    callId already has a record (the call is answered from it)."""
    flat = [item for pair in fields.items() for item in pair]
    state: Any = await client.eval(_GRANT, 1, approval_key(call_id), keep_s, *flat)
    return state is None


async def decide(
    client: aioredis.Redis, publisher: Publisher, call_id: str, decision: Decision, by: str, reason: str
) -> ParkedCall:
    """Approve (back onto its queue, to run once) or deny (answered 77) a parked call; raises NotParked."""
    key = approval_key(call_id)
    verdict: dict[str, str] = {
        "state": APPROVED if decision == "approve" else DENIED,
        "decidedBy": by,
        "reason": reason,
    }
    verdict["decidedAt"] = repr(time.time())
    async with client.pipeline(transaction=True) as pipe:
        try:
            await pipe.watch(key)
            parked = ParkedCall(call_id, _decoded(await pipe.hgetall(key)))
            if parked.state != PARKED:
                raise NotParked(call_id, parked.state or None)
            if float(parked.fields.get("expires") or 0) <= time.time():  # due: the sweep answers it
                raise NotParked(call_id, EXPIRED)
            pipe.multi()
            pipe.hset(key, mapping=verdict)  # type: ignore[arg-type]  # redis-py keys a mapping by any field type
            if decision == "approve":
                _requeue(pipe, parked)
            else:
                pipe.zadd(APPROVALS_KEY, {call_id: 0})  # its envelope is due now (the sweeper's if not ours)
            await pipe.execute()
        except aioredis.WatchError:  # decided by someone else between our read and our write
            raise NotParked(call_id, (await _fields(client, key)).get("state")) from None
    log.info("call.decided", callId=call_id, decision=decision, decidedBy=by)
    if decision == "deny":
        await settle(client, publisher, call_id)
    return ParkedCall(call_id, {**parked.fields, **verdict})


def _requeue(pipe: Any, parked: ParkedCall) -> None:
    """Push the call back onto its tenant's list (as a fresh message), in the decision's transaction."""
    queue, tenant = parked.fields.get("queue") or DEFAULT_QUEUE, parked.fields.get("tenant") or ""
    message = task_message(parked.call_id, [resumed(parked.call, float(parked.fields.get("since") or 0))], queue)
    source = scheduler.tenant_list(queue, tenant or DEFAULT_TENANT)
    pipe.zrem(APPROVALS_KEY, parked.call_id)
    pipe.lpush(source, message)
    scheduler.requeued(pipe, source, message.encode(), in_flight=False)


def resumed(call: dict[str, Any], parked_at: float) -> dict[str, Any]:
    """The call as it goes back to its queue: its time does not run while it waits for a human. Its
    deadline goes; the budget it had when parked (timeoutSeconds, or what the deadline left) starts again."""
    deadline = call.pop("deadline", None)
    if deadline is not None and "timeoutSeconds" not in call:
        at = datetime.fromisoformat(str(deadline).replace("Z", "+00:00"))
        left_s = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() - parked_at
        call["timeoutSeconds"] = min(MAX_CALL_TIMEOUT_S, max(1.0, left_s))
    return call


async def settle(client: aioredis.Redis, publisher: Publisher, call_id: str) -> str | None:
    """Look at a call whose time came: a parked one expires; a denied or expired one has its envelope
    published (once: the publication is); it then leaves the index. Its state after."""
    key = approval_key(call_id)
    state: Any = await client.eval(_DUE, 1, key)
    state = state.decode() if isinstance(state, bytes) else state
    if state in (DENIED, EXPIRED):
        parked = ParkedCall(call_id, await _fields(client, key))
        callback = parked.call.get("callback")
        callback_url = callback.get("url") if isinstance(callback, dict) else None
        await publisher.publish_one(parked.refusal(), parked.fields.get("replyTo") or None, callback_url)
        log.info("call.refused", callId=call_id, state=state)
    await client.zrem(APPROVALS_KEY, call_id)
    return str(state) if state is not None else None


async def sweep(client: aioredis.Redis, publisher: Publisher) -> int:
    """Settle the calls whose time came (expired, or denied and not yet answered); how many."""
    due: list[Any] = await client.zrangebyscore(APPROVALS_KEY, "-inf", time.time(), start=0, num=SWEEP_BATCH)
    for raw in due:
        await settle(client, publisher, raw.decode() if isinstance(raw, bytes) else str(raw))
    return len(due)


async def sweep_forever(client: aioredis.Redis, publisher: Publisher, every_s: float = SWEEP_EVERY_S) -> None:
    """Every worker process sweeps; the scripts and the publication make that safe from any number."""
    while True:
        try:
            await sweep(client, publisher)
        except Exception as exc:  # Redis away: the next turn tries again
            log.warning("approvals.sweep_failed", error=f"{type(exc).__name__}: {str(exc)[:200]}")
        await asyncio.sleep(every_s)


async def waiting(client: aioredis.Redis) -> list[ParkedCall]:
    """The calls waiting for a decision, oldest expiry first."""
    ids: list[Any] = await client.zrangebyscore(APPROVALS_KEY, time.time(), "+inf", start=0, num=MAX_LISTED)
    names = [raw.decode() if isinstance(raw, bytes) else str(raw) for raw in ids]
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hgetall(approval_key(name))
        rows = await pipe.execute()
    parked = [ParkedCall(name, _decoded(row)) for name, row in zip(names, rows, strict=True)]
    return [p for p in parked if p.state == PARKED]


async def _fields(client: aioredis.Redis, key: str) -> dict[str, str]:
    return _decoded(await client.hgetall(key))


def _decoded(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _iso(epoch: str | None) -> str | None:
    if not epoch:
        return None
    return datetime.fromtimestamp(float(epoch), UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
