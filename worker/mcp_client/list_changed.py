"""A server's `notifications/tools/list_changed` on a session the process holds, told to whoever refreshes its
listing (worker/upstreams/changes.py). Before 2026-07-28 the server sends it on the session's streams (the GET
stream, or a call's own); from 2026-07-28 only on a `subscriptions/listen` stream, which the session holds
open beside it while the server declares `tools.listChanged`. Either way it reaches the session's
`message_handler`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio
import structlog
from mcp.client import Client
from mcp.client.session import IncomingMessage, MessageHandlerFnT
from mcp.types import ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

log = structlog.get_logger("toolworker.mcp")
# Told the upstream's name; must not block (the session's reader calls it).
OnToolsChanged = Callable[[str], None]


def tools_changed_handler(upstream: str, on_change: OnToolsChanged | None) -> MessageHandlerFnT | None:
    """The session's message handler that tells `on_change` of the server's tool list changing."""
    if on_change is None:
        return None

    async def handler(message: IncomingMessage) -> None:
        if isinstance(message, ToolListChangedNotification):
            on_change(upstream)
        await anyio.lowlevel.checkpoint()

    return handler


async def held_open(client: Client, stop: asyncio.Event, listening: bool, upstream: str) -> None:
    """Wait for `stop`; meanwhile, on a 2026-07-28 session whose server declares `tools.listChanged`, hold a
    `subscriptions/listen` stream for it (its events reach the message handler). A stream that cannot be
    opened or drops leaves the session as it is: the periodic refresh still reads the tools."""
    capabilities = client.session.server_capabilities
    tools = capabilities.tools if capabilities is not None else None
    modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
    if not (listening and modern and tools is not None and tools.list_changed):
        await stop.wait()
        return
    try:
        # Its events are not read from it: each reaches the message handler too, and the SDK keeps at most
        # one of a kind waiting in the subscription.
        async with client.listen(tools_list_changed=True):
            await stop.wait()
    except Exception as exc:  # the server refused or dropped the stream: notifications are a bonus
        log.info("mcp.listen_ended", upstream=upstream, reason=type(exc).__name__)
        await stop.wait()
