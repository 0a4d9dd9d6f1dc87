"""Refreshing an MCP upstream whose server said its tools changed (`notifications/tools/list_changed` on a
session this process holds; worker/mcp_client/list_changed.py): once per burst, through the refresh's lock.

    server ─notification─▶ Sessions.on_tools_changed ─▶ ChangedTools.changed (noted, settles SETTLE_S)
           ─▶ Refresher.refresh_since (the lock; another process's refresh since the notice is enough)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog
from redis.exceptions import RedisError

from worker import errors
from worker.definitions.model import ToolSet
from worker.upstreams.refresh import Refresher

log = structlog.get_logger("toolworker.upstreams")
# How long a burst of notifications settles before the one refresh it asks for.
SETTLE_S = 0.5


class ChangedTools:
    """One refresh per burst of notifications per upstream; a notification during that refresh asks for one
    more after it (the server may have changed again after it was read)."""

    def __init__(self, refresher: Refresher, toolset: Callable[[], ToolSet], settle_s: float = SETTLE_S) -> None:
        self._refresher = refresher
        self._toolset = toolset
        self._settle_s = settle_s
        self._noticed: dict[str, float] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self.refreshes = 0

    def changed(self, upstream: str) -> None:
        """A server said so (called by the session's reader: schedules, never waits)."""
        self._noticed[upstream] = time.time()
        task = self._running.get(upstream)
        if task is None or task.done():
            self._running[upstream] = asyncio.get_running_loop().create_task(
                self._refresh(upstream), name=f"mcp-tools-changed-{upstream}"
            )

    async def _refresh(self, name: str) -> None:
        while True:
            await asyncio.sleep(self._settle_s)
            noticed = self._noticed[name]
            upstream = self._toolset().upstreams.get(name)
            if upstream is None or upstream.mcp is None:
                return
            try:
                await self._refresher.refresh_since(upstream, noticed)
                self.refreshes += 1
            except (RedisError, errors.ToolError) as exc:
                log.warning("mcp.tools_changed_refresh_failed", upstream=name, error=str(exc))
            log.info("mcp.tools_changed", upstream=name)
            if self._noticed[name] == noticed:
                return

    async def close(self) -> None:
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
