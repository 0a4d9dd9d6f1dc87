"""What a worker process runs beside its calls for the MCP upstreams: refreshing the listings that are due or
whose server said its tools changed, and serving every listing stored (by any process) from the next call on."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

import redis.asyncio as aioredis

from worker.call.delegated import UserTokens
from worker.call.runtime import Runtime
from worker.definitions import listings
from worker.definitions.mcp_tools import Listing
from worker.definitions.model import ToolSet
from worker.upstreams.changes import ChangedTools
from worker.upstreams.refresh import Refresher, refresh_forever


def upstream_work(
    runtime: Runtime,
    defined: Callable[[], ToolSet],
    relist: Callable[[dict[str, Listing]], None],
    poll_s: float,
    audit_maxlen: int,
) -> list[Coroutine[Any, Any, None]]:
    """The coroutines to run on the process's loop (none without Redis). The refresher is made when first
    needed (an MCP upstream is defined, or a server says its tools changed): with it, the MCP client."""
    client: aioredis.Redis | None = runtime.redis
    if client is None:
        return []
    users = UserTokens(client, runtime.users.keyring, None, audit_maxlen)

    @functools.cache
    def refresher() -> Refresher:
        return Refresher(
            client, runtime.mcp, runtime.environ, runtime.transport, audit_maxlen, runtime.mcp_authorization, users
        )

    @functools.cache
    def changes() -> ChangedTools:
        return ChangedTools(refresher(), defined)

    runtime.on_tools_changed = lambda upstream: changes().changed(upstream)

    def wanted() -> bool:
        return listings.has_mcp(defined())

    return [refresh_forever(refresher, defined), listings.follow(client, -1, poll_s, relist, wanted)]
