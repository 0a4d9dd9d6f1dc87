"""Requests to a 2025-11-25 HTTP client during its `tools/call`, their answers carried through Redis.

A `tools/call` of a session (sessions.py) whose client declared elicitation is answered as an event stream,
and the handler may send the client a request on it (`elicitation/create`: approval in form mode, consent
in URL mode). The client POSTs its answer separately, to whichever gateway process the load balancer picks;
that process finds the session (McpSessions), pushes the answer to a Redis list and answers 202, and the
process holding the stream, waiting on the list, hands the answer to the SDK's dispatcher as if it had
arrived on the call's own transport:

    toolworker:gateway:mcp-reply:<sha256 of the session id>:<request id>   the client's JSON-RPC answer;
                                                                             kept REPLY_KEEP_S at most

Each request sent gets a fresh random id (the dispatcher's own ids restart at 0 with every call), so two
calls of one session never take each other's answers. No answer within the call's deadline: the request is
answered for the client with an error, and the call ends with it; nothing was sent (asking comes first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import anyio
import redis.asyncio as aioredis
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import SessionMessage
from mcp.shared.transport_context import TransportContext
from mcp_types import DEFAULT_NEGOTIATED_VERSION, INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCRequest
from mcp_types.jsonrpc import jsonrpc_message_adapter
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

log = structlog.get_logger("toolworker.gateway.mcp")

REPLY_KEY_PREFIX = "toolworker:gateway:mcp-reply:"
# The request's back channel, set by McpSessions on a `tools/call` of a session that can be asked.
BACK_CHANNEL_SCOPE_KEY = "toolworker.mcp_back_channel"
# One wait on the list: short, so a Redis client's socket timeout never cuts a long deadline.
_WAIT_SLICE_S = 1.0
_ENDED = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)


class Replies:
    """The clients' answers to requests sent on a call's stream, in Redis."""

    def __init__(self, redis: aioredis.Redis, keep_s: float) -> None:
        self._redis = redis
        self.keep_s = keep_s

    async def deliver(self, session_id: str, reply: dict[str, Any]) -> None:
        """Hand a client's answer to whichever process waits for it."""
        key = _reply_key(session_id, str(reply.get("id")))
        await self._redis.rpush(key, json.dumps(reply))
        await self._redis.expire(key, max(1, int(self.keep_s)))

    async def wait(self, session_id: str, request_id: str) -> dict[str, Any] | None:
        """The answer to a request, or None when none came within `keep_s`."""
        key = _reply_key(session_id, request_id)
        deadline = time.monotonic() + self.keep_s
        while (left_s := deadline - time.monotonic()) > 0:
            found = await self._redis.blpop([key], timeout=max(0.01, min(_WAIT_SLICE_S, left_s)))
            if found is not None:
                reply = json.loads(found[1])
                return reply if isinstance(reply, dict) else None
        return None


@dataclass(frozen=True)
class Channel:
    """Where the answers to this request's requests come from: its session, through `replies`."""

    session_id: str
    replies: Replies


def is_reply(message: Any) -> bool:
    """A JSON-RPC response (an answer to a request the server sent), not a request or notification."""
    return (
        isinstance(message, dict)
        and "id" in message
        and "method" not in message
        and ("result" in message or "error" in message)
    )


class BackChannelTransport(StreamableHTTPSessionManager):
    """The SDK's stateless transport; a request carrying a back channel may send the client requests on its
    event stream, their answers arriving through Redis."""

    @property
    def lifespan_state(self) -> Any:
        """What the server's lifespan gave when the transport started (its handlers' `lifespan_context`)."""
        return self._lifespan_state

    async def _handle_stateless_request(
        self, protocol_version_hint: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        channel = scope.get(BACK_CHANNEL_SCOPE_KEY)
        if not isinstance(channel, Channel):
            return await super()._handle_stateless_request(protocol_version_hint, scope, receive, send)
        http_transport = StreamableHTTPServerTransport(
            mcp_session_id=None,
            is_json_response_enabled=False,
            event_store=None,
            security_settings=self.security_settings,
        )
        version = protocol_version_hint or DEFAULT_NEGOTIATED_VERSION

        async def run(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with http_transport.connect() as (read_stream, write_stream):
                await self._serve(channel, version, read_stream, write_stream, task_status)

        assert self._task_group is not None  # the manager runs (app.py's lifespan)
        try:
            await self._task_group.start(run)
            await http_transport.handle_request(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await http_transport.terminate()

    async def _serve(
        self,
        channel: Channel,
        version: str,
        read_stream: ReadStream[SessionMessage | Exception],
        write_stream: WriteStream[SessionMessage],
        task_status: TaskStatus[None],
    ) -> None:
        """Serve the request, its outgoing requests' answers relayed from Redis into what the server reads."""
        inbound_send, inbound = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        outbound, outbound_receive = anyio.create_memory_object_stream[SessionMessage](16)
        async with anyio.create_task_group() as relays:
            relays.start_soon(_forward_in, read_stream, inbound_send)
            relays.start_soon(_forward_out, outbound_receive, write_stream, channel, inbound_send, relays)
            task_status.started()
            dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                inbound,
                outbound,
                inline_methods=frozenset({"initialize"}),
                transport_builder=lambda _md: TransportContext(kind="streamable-http", can_send_request=True),
            )
            try:
                await serve_connection(
                    self.app,
                    dispatcher,
                    connection=Connection.from_envelope(version, None, None),
                    lifespan_state=self._lifespan_state,
                )
            except Exception:  # as the SDK's stateless path: a crash ends this request, not the process
                log.exception("gateway.mcp_request_crashed")
            relays.cancel_scope.cancel()


async def _forward_in(
    read_stream: ReadStream[SessionMessage | Exception],
    inbound: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    """What the POST brings, to the server; its end ends the server's reading."""
    async with inbound:
        with contextlib.suppress(*_ENDED):  # the transport ended (the POST answered, or the client gone)
            async for message in read_stream:
                await inbound.send(message)


async def _forward_out(
    outbound: MemoryObjectReceiveStream[SessionMessage],
    write_stream: WriteStream[SessionMessage],
    channel: Channel,
    inbound: MemoryObjectSendStream[SessionMessage | Exception],
    relays: TaskGroup,
) -> None:
    """What the server writes, to the event stream; a request gets a fresh id and a waiter for its answer."""
    async with write_stream:
        with contextlib.suppress(*_ENDED):
            async for item in outbound:
                message = item.message
                if isinstance(message, JSONRPCRequest):
                    wire_id = secrets.token_urlsafe(16)
                    relays.start_soon(_await_reply, channel, wire_id, message.id, inbound)
                    item = SessionMessage(message.model_copy(update={"id": wire_id}), item.metadata)
                await write_stream.send(item)


async def _await_reply(
    channel: Channel, wire_id: str, request_id: Any, inbound: MemoryObjectSendStream[SessionMessage | Exception]
) -> None:
    """Wait for the client's answer through Redis, and give it to the server under the id it sent."""
    reply = await channel.replies.wait(channel.session_id, wire_id)
    message = _as_answer(reply, request_id)
    with contextlib.suppress(*_ENDED):  # the call ended first
        await inbound.send(SessionMessage(message))


def _as_answer(reply: dict[str, Any] | None, request_id: Any) -> Any:
    """The client's answer under the server's request id; an error when none came or it is malformed."""
    if reply is not None:
        try:
            return jsonrpc_message_adapter.validate_python({**reply, "id": request_id})
        except ValidationError:
            pass
    text = "The client did not answer in time" if reply is None else "The client's answer is malformed"
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=INTERNAL_ERROR, message=text))


def _reply_key(session_id: str, request_id: str) -> str:
    digest = hashlib.sha256(session_id.encode()).hexdigest()
    return f"{REPLY_KEY_PREFIX}{digest}:{request_id}"
