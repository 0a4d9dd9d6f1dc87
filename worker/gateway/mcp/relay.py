"""An MCP upstream speaking to our MCP caller during its call: what the caller listens for goes with the call
(`relay` in its message), and what the upstream sends comes back through Redis (worker/call/relay.py) onto
the caller's stream, while the gateway waits for the result.

    progress        the caller sent a progressToken: the gateway's own "waiting" progress until the upstream's
                    first, then the upstream's, shifted by what was already reported (values only increase)
    log messages    at or above the caller's level: `logging/setLevel` (2025-11-25 and before; kept with the
                    HTTP session, or the stdio connection), the request's log-level `_meta` (2026-07-28)
    requests        `elicitation/create` in a mode the caller declared, `sampling/createMessage` if it declared
                    sampling: sent on the call's stream (stdio, or a 2025-11-25 HTTP session's back channel,
                    back_channel.py), the caller's answer handed back as it gave it. A 2026-07-28 caller
                    that declared the capability is asked by result: the request ends with an
                    `input_required` result carrying the upstream's request (its key the worker's id for it)
                    and a `requestState` naming the call and where its events were read to; its retry, on
                    any gateway process, hands the answer to the waiting worker and follows the same call
                    on (`Resume`), the call's owner only. A caller that declared neither is not asked: the
                    upstream's request is declined, and the tool result's note says so.

A task's caller listens to nobody's stream: its call relays progress all the same, and the last progress
(its message, else "progress N of M") is the task's status message while it works.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import redis.asyncio as aioredis
import structlog
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from worker.constants import KIND_MCP
from worker.gateway.calls import Calls, Submitted
from worker.gateway.identity.principals import principal_of
from worker.gateway.mcp import asking
from worker.gateway.mcp.sessions import SESSION_HEADER, Handshakes, handshake_of
from worker.protocol import call_answer_key, call_events_key

log = structlog.get_logger("toolworker.gateway.mcp")
Context = ServerRequestContext[Any, Any]
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
# One wait for the followed calls' events: short, so a call followed meanwhile joins the next read soon (its
# events wait in its stream).
_BLOCK_MS = 250
# The events read once the result came (a stream holds at most 256).
EVENTS_READ_AT_END = 256
# A caller's answer is kept this long for the worker waiting on it.
ANSWER_KEEP_S = 300
# How far back a task's status looks for the last progress message.
_STATUS_LOOKBACK = 32
# The `requestState` of a call whose upstream asked its 2026-07-28 caller (then base64url of its JSON).
STATE_PREFIX = "toolworker/relay."


class LogLevels:
    """The level each caller set with `logging/setLevel`: an HTTP session's in its record (sessions.py), the
    stdio connection's here (one client per process)."""

    def __init__(self, handshakes: Handshakes) -> None:
        self._handshakes = handshakes
        self._stdio: str | None = None

    async def set_level(self, ctx: Context, params: types.SetLevelRequestParams) -> dict[str, Any]:
        if not isinstance(ctx.request, Request):
            self._stdio = params.level
            return {}
        session_id = ctx.request.headers.get(SESSION_HEADER)
        if session_id is not None:
            principal = principal_of(ctx.request.scope).name
            await self._handshakes.set_log_level(session_id, principal, params.level)
        return {}  # a caller without a session sets its level on each request (2026-07-28)

    def level(self, ctx: Context) -> str | None:
        """The caller's level for this request; None: it hears no log messages."""
        if not asking.asks_by_result(ctx):
            if not isinstance(ctx.request, Request):
                return self._stdio
            handshake = handshake_of(ctx.request.scope)
            return None if handshake is None else handshake.log_level
        meta = (ctx.params or {}).get("_meta")
        level = meta.get(types.LOG_LEVEL_META_KEY) if isinstance(meta, Mapping) else None
        return level if level in LEVELS else None


def wanted(ctx: Context, level: str | None) -> dict[str, Any] | None:
    """What this caller listens for during its call (the call message's `relay`); None: nothing."""
    meta = (ctx.params or {}).get("_meta")
    progress = isinstance(meta, Mapping) and meta.get("progressToken") is not None
    # Asked by result (2026-07-28: the request's own capabilities), else on the call's stream.
    can_ask = asking.asks_by_result(ctx) or ctx.session.can_send_request
    elicitation = [mode for mode in ("form", "url") if can_ask and asking.declared(ctx, mode)]
    capabilities = asking.capabilities_of(ctx)
    sampling = can_ask and capabilities is not None and capabilities.sampling is not None
    if not (progress or level or elicitation or sampling):
        return None
    relay: dict[str, Any] = {"progress": progress, "elicitation": elicitation, "sampling": sampling}
    if level is not None:
        relay["logLevel"] = level
    return relay


Entry = tuple[str, dict[str, Any]]


class _Reader:
    """The events of every call a gateway process follows on one Redis (a shard): one blocking XREAD for all
    of them (not a connection each), each entry handed to its call's queue. It runs while calls are followed."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._followed: dict[str, tuple[str, asyncio.Queue[Entry]]] = {}
        self._task: asyncio.Task[None] | None = None

    def open(self, key: str, after: str = "0-0") -> asyncio.Queue[Entry]:
        queue: asyncio.Queue[Entry] = asyncio.Queue()
        self._followed[key] = (after, queue)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._read())
        return queue

    def close(self, key: str) -> None:
        self._followed.pop(key, None)

    async def _read(self) -> None:
        while self._followed:
            streams: dict[Any, Any] = {key: last for key, (last, _queue) in self._followed.items()}
            try:
                found: Any = await self.redis.xread(streams, count=64, block=_BLOCK_MS)
            except (aioredis.RedisError, OSError) as exc:
                log.warning("gateway.relay_read_failed", error=str(exc))
                await asyncio.sleep(_BLOCK_MS / 1000)
                continue
            for raw_key, entries in found or []:
                key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
                followed = self._followed.get(key)
                for entry in _events(entries):
                    if followed is not None:
                        followed = self._followed[key] = (entry[0], followed[1])
                        followed[1].put_nowait(entry)


_readers: dict[int, _Reader] = {}


def _reader(redis: aioredis.Redis) -> _Reader:
    reader = _readers.get(id(redis))
    if reader is None or reader.redis is not redis:
        reader = _readers[id(redis)] = _Reader(redis)
    return reader


class Follow:
    """One call's upstream events, relayed to its caller's stream while the gateway waits (see the module)."""

    def __init__(
        self, ctx: Context, redis: aioredis.Redis, call_id: str, wants: Mapping[str, Any], after: str = "0-0"
    ) -> None:
        self._ctx = ctx
        self._redis = redis
        self._call_id = call_id
        self._key = call_events_key(call_id)
        self._wants = wants
        self._last_id = after  # the events up to here were relayed (by an earlier round, when resumed)
        self._by_result = asking.asks_by_result(ctx)
        self._queue: asyncio.Queue[Entry] | None = None
        self._sent = 0.0  # the last progress value sent
        self._offset: float | None = None  # what the upstream's progress is shifted by, from its first
        self._asking: set[asyncio.Task[None]] = set()
        self._relaying: asyncio.Future[None] | None = None  # the event being relayed by `follow`

    @classmethod
    def of(
        cls, ctx: Context, calls: Calls, submitted: Submitted, wants: Mapping[str, Any] | None, after: str = "0-0"
    ) -> Follow | None:
        """The relay of a call just enqueued (or resumed after `after`) whose caller listens; None otherwise."""
        if wants is None or not submitted.enqueued or submitted.tool.kind != KIND_MCP:
            return None  # only an MCP upstream speaks during a call
        return cls(ctx, calls.client.redis_of(submitted.principal.tenant), submitted.call_id, wants, after)

    async def waiting(self, every_s: float) -> None:
        """The gateway's own progress (seconds waited), until the upstream reports its own."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(every_s)
            waited = time.monotonic() - started
            if self._offset is None and waited > self._sent:
                self._sent = waited
                await self._ctx.session.report_progress(
                    waited, None, f"Waiting for the call's result: {waited:.0f} s so far."
                )

    async def follow(self) -> None:
        """Relay the call's events as they come (read by the process's reader of its Redis); never returns (the
        call's result ends it)."""
        reader = _reader(self._redis)
        self._queue = reader.open(self._key, self._last_id)
        try:
            while True:
                entry_id, event = await self._queue.get()
                self._last_id = entry_id
                # Whole even when the result ends the wait meanwhile (cancelled halfway, a notification would be
                # lost, its id counted as relayed): `drain` waits for it.
                self._relaying = asyncio.ensure_future(self._relay(event, asking=True))
                self._relaying.add_done_callback(_retrieved)  # left alone when the client hung up meanwhile
                await asyncio.shield(self._relaying)
        finally:
            reader.close(self._key)

    async def drain(self) -> None:
        """The events written before the result, not yet relayed (progress and log messages)."""
        if self._relaying is not None:
            with contextlib.suppress(Exception):  # its failure was `follow`'s to report
                await self._relaying
        for task in self._asking:  # (after the relay above: a request it relays is asked in a task of its own)
            task.cancel()
        while self._queue is not None and not self._queue.empty():
            entry_id, event = self._queue.get_nowait()
            self._last_id = entry_id
            await self._relay(event, asking=False)
        with contextlib.suppress(aioredis.RedisError, OSError):
            found: Any = await self._redis.xread({self._key: self._last_id}, count=EVENTS_READ_AT_END)
            for _key, entries in found or []:
                for entry_id, event in _events(entries):
                    self._last_id = entry_id
                    await self._relay(event, asking=False)

    async def _relay(self, event: Mapping[str, Any], asking: bool) -> None:
        kind = event.get("kind")
        if kind == "progress" and self._wants.get("progress"):
            await self._progress(event)
        elif kind == "log":
            await self._log(event)
        elif kind == "request" and asking and self._by_result:
            raise Asked(self._input_required(event))
        elif kind == "request" and asking:
            task = asyncio.get_running_loop().create_task(self._ask(event))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _progress(self, event: Mapping[str, Any]) -> None:
        progress, total = event.get("progress"), event.get("total")
        if not isinstance(progress, int | float):
            return
        if self._offset is None:
            self._offset = self._sent
        value = self._offset + progress
        if value <= self._sent:  # never backwards
            return
        self._sent = value
        shifted = self._offset + total if isinstance(total, int | float) else None
        message = event.get("message")
        await self._ctx.session.report_progress(value, shifted, message if isinstance(message, str) else None)

    async def _log(self, event: Mapping[str, Any]) -> None:
        level = event.get("level")
        wanted_level = self._wants.get("logLevel")
        if level not in LEVELS or wanted_level not in LEVELS or LEVELS.index(level) < LEVELS.index(wanted_level):
            return
        logger = event.get("logger")
        params = types.LoggingMessageNotificationParams(
            level=level, data=event.get("data"), logger=logger if isinstance(logger, str) else None
        )
        # On the call's own stream (the SDK's send_log_message is deprecated; the level was checked here).
        notification = types.LoggingMessageNotification(params=params)
        await self._ctx.session.send_notification(notification, self._ctx.request_id)

    def _input_required(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """The upstream's request put to a 2026-07-28 caller: its retry brings the answer (`Resume`)."""
        resume = Resume(self._call_id, self._last_id, str(event.get("id")))
        method, params = str(event.get("method")), event.get("params") or {}
        return asking.input_required(resume.asked, method, params, resume.state())

    async def _ask(self, event: Mapping[str, Any]) -> None:
        """Ask the caller the upstream's request, and hand its answer (or error) to the waiting worker."""
        request_id = str(event.get("id"))
        try:
            result = await _asked(self._ctx, str(event.get("method")), event.get("params") or {})
            answer: dict[str, Any] = {"result": result}
        except MCPError as exc:
            answer = {"error": {"code": exc.error.code, "message": exc.error.message}}
        except ValidationError:
            answer = {"error": {"code": types.INVALID_PARAMS, "message": "The caller's answer was malformed."}}
        await _hand_back(self._redis, self._call_id, request_id, answer)


def _retrieved(future: asyncio.Future[None]) -> None:
    """A relay's failure is `follow`'s (or nobody's, once the wait is over): not the loop's to log."""
    if not future.cancelled():
        future.exception()


async def _hand_back(redis: aioredis.Redis, call_id: str, request_id: str, answer: Mapping[str, Any]) -> None:
    """The caller's answer to the upstream's request, for the worker waiting on it."""
    key = call_answer_key(call_id, request_id)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.rpush(key, json.dumps(answer))
        pipe.expire(key, ANSWER_KEEP_S)
        await pipe.execute()


class Asked(Exception):
    """The call's upstream asked its 2026-07-28 caller something: `result` (input_required) answers the request."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("input required")
        self.result = result


@dataclass(frozen=True)
class Resume:
    """A 2026-07-28 caller's retry after an upstream's request (its `requestState`): the call asked, where its
    events were relayed to, and the id of the request the retry answers."""

    call_id: str
    after: str
    asked: str

    def state(self) -> str:
        """The `requestState` naming this resume (read back by `of`)."""
        fields = {"call": self.call_id, "after": self.after, "asked": self.asked}
        return STATE_PREFIX + base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()

    @classmethod
    def of(cls, params: Mapping[str, Any] | None) -> Resume | None:
        """The resume a request's `requestState` names; None for another state (or none); raises MCPError for
        one of ours that is malformed."""
        state = (params or {}).get("requestState")
        if not isinstance(state, str) or not state.startswith(STATE_PREFIX):
            return None
        try:
            fields = json.loads(base64.urlsafe_b64decode(state[len(STATE_PREFIX) :].encode()))
            resume = cls(str(fields["call"]), str(fields["after"]), str(fields["asked"]))
        except (ValueError, TypeError, KeyError, binascii.Error):
            raise unknown_state() from None
        return resume

    async def answer(self, redis: aioredis.Redis, params: Mapping[str, Any]) -> None:
        """Hand the caller's answer (its `inputResponses` under the request's id) to the waiting worker."""
        responses = params.get(asking.INPUT_RESPONSES_KEY)
        response = responses.get(self.asked) if isinstance(responses, Mapping) else None
        answer: dict[str, Any] = (
            {"result": dict(response)}
            if isinstance(response, Mapping)
            else {"error": {"code": types.INVALID_REQUEST, "message": "The caller gave no answer."}}
        )
        await _hand_back(redis, self.call_id, self.asked, answer)


def unknown_state() -> MCPError:
    """A `requestState` that names no call of this caller (forged, expired, another's)."""
    return MCPError(code=types.INVALID_PARAMS, message="The requestState names no call of this caller.")


async def _asked(ctx: Context, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The upstream's request sent to the caller as it came; the caller's result as it gave it."""
    metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
    result: BaseModel
    if method == "elicitation/create":
        request = types.ElicitRequest.model_validate({"method": method, "params": params})
        result = await ctx.session.send_request(request, types.ElicitResult, metadata=metadata)
    elif method == "sampling/createMessage":
        sampling = types.CreateMessageRequest.model_validate({"method": method, "params": params})
        result_type: type[BaseModel] = (
            types.CreateMessageResultWithTools if params.get("tools") else types.CreateMessageResult
        )
        result = await ctx.session.send_request(sampling, result_type, metadata=metadata)
    else:
        raise MCPError(code=types.METHOD_NOT_FOUND, message=f"Not relayed: {method}")
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


async def last_progress(redis: aioredis.Redis, call_id: str) -> str | None:
    """The call's last progress message (a task's status while it works), if its upstream gave one."""
    try:
        entries: Any = await redis.xrevrange(call_events_key(call_id), count=_STATUS_LOOKBACK)
    except (aioredis.RedisError, OSError):
        return None
    for _entry_id, event in _events(entries):
        if event.get("kind") != "progress":
            continue
        message, progress, total = event.get("message"), event.get("progress"), event.get("total")
        if isinstance(message, str) and message:
            return message
        if isinstance(progress, int | float):
            of_total = f" of {total:g}" if isinstance(total, int | float) else ""
            return f"The tool reports progress {progress:g}{of_total}."
    return None


def _events(entries: Any) -> list[Entry]:
    """A stream's entries as (id, event); an entry that is not one of ours is an empty event."""
    events = []
    for entry_id, fields in entries or []:
        raw = (fields or {}).get(b"event") or (fields or {}).get("event")
        try:
            event = json.loads(raw) if raw else {}
        except ValueError:
            event = {}
        text_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        events.append((text_id, event if isinstance(event, dict) else {}))
    return events
