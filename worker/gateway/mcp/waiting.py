"""Waiting for a call's envelope on `tools/call` (server.py): while the HTTP client may hang up (then the call is
withdrawn if it has not started, and an upstream task it waits on is cancelled), with progress for a client that
sent a progressToken, and with what an MCP upstream sends relayed to a client that listens (relay.py; a
2026-07-28 caller is asked by result: `Asked`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import mcp_types as types
import structlog
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from worker.envelope import ToolResult
from worker.gateway import metrics
from worker.gateway.calls import Calls, Submitted
from worker.gateway.mcp.relay import Asked, Context, Follow

log = structlog.get_logger("toolworker.gateway.mcp")
T = TypeVar("T")
# How often a waiting call's progress is reported (to a client that sent a progressToken).
PROGRESS_EVERY_S = 1.0


class ClientGone(MCPError):
    """The HTTP client closed its request while its call was waiting (a 2026-07-28 client cancels so)."""

    def __init__(self) -> None:
        super().__init__(
            code=types.INTERNAL_ERROR, message="The request was closed; its call was withdrawn if it had not started."
        )


class Waiting:
    """The MCP front's wait for its calls (`spawn` runs a withdrawal in the background)."""

    def __init__(self, calls: Calls, timeout_s: float, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.calls = calls
        self.timeout_s = timeout_s
        self._spawn = spawn

    async def envelope(
        self, ctx: Context, submitted: Submitted, relay: Mapping[str, Any] | None, after: str
    ) -> ToolResult | None:
        """The call's envelope (None when it did not come in time); raises Asked when its upstream asks a
        2026-07-28 caller (the call goes on), and withdraws the call when the wait ends otherwise."""
        try:
            return await self._watched(ctx, submitted, relay, after)
        except Asked:
            raise
        except BaseException:  # cancelled, or the client hung up: a call that has not started is not run
            self._spawn(self._withdraw(submitted.call_id, submitted.tool.name, submitted.principal.tenant))
            raise

    async def _watched(
        self, ctx: Context, submitted: Submitted, relay: Mapping[str, Any] | None, after: str
    ) -> ToolResult | None:
        watchers: list[Coroutine[Any, Any, None]] = []
        if isinstance(ctx.request, Request):
            watchers.append(_hang_up(ctx.request))
        follow = Follow.of(ctx, self.calls, submitted, relay, after)
        if follow is not None:
            watchers.append(follow.follow())
        if _asked_for_progress(ctx):
            watchers.append(
                follow.waiting(PROGRESS_EVERY_S) if follow else _report_progress(ctx.session, PROGRESS_EVERY_S)
            )
        waiting = self.calls.answer(submitted, self.timeout_s)
        envelope = await (_unless(waiting, watchers) if watchers else waiting)
        if follow is not None:
            await follow.drain()
        return envelope

    async def _withdraw(self, call_id: str, tool: str, tenant: str) -> None:
        withdrawn = await self.calls.withdraw(call_id, tool, tenant)
        if withdrawn:
            metrics.WITHDRAWN.inc()
        upstream_task = not withdrawn and await self.calls.cancel_upstream_task(call_id)
        log.info("gateway.call_cancelled", callId=call_id, tool=tool, withdrawn=withdrawn, upstream_task=upstream_task)


def _asked_for_progress(ctx: Context) -> bool:
    """Whether the request's raw `_meta` carries a progressToken."""
    meta = (ctx.params or {}).get("_meta")
    return isinstance(meta, Mapping) and meta.get("progressToken") is not None


async def _unless(waiting: Coroutine[Any, Any, T], watchers: list[Coroutine[Any, Any, None]]) -> T:
    """What `waiting` gives, unless a watcher ends first: the client hung up (ClientGone), or an upstream asked
    (Asked)."""
    main = asyncio.ensure_future(waiting)
    others = [asyncio.ensure_future(watcher) for watcher in watchers]
    try:
        await asyncio.wait([main, *others], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in others:
            task.cancel()
    if not main.done():
        main.cancel()
        for task in others:
            error = task.exception() if task.done() and not task.cancelled() else None
            if isinstance(error, Asked):
                raise error
        raise ClientGone()
    return main.result()


async def _hang_up(request: Request) -> None:
    """Returns when the client closes the request (the body was read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _report_progress(session: ServerSession, every_s: float) -> None:
    """Progress notifications while a call waits (its seconds so far), for a client that sent a token."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        waited = time.monotonic() - started
        await session.report_progress(waited, None, f"Waiting for the call's result: {waited:.0f} s so far.")
