"""The operators' console: `/console` on the gateway, server-rendered HTML that works without JavaScript.

Signed in with a gateway static token whose principal may `operate` (sessions.py, gate.py); pages for
the fleet, the catalog (and trying a tool), the upstreams (accepting what `pin` withheld), dead letters
(inspect, purge, replay) and the audit trail (pages.py, templates/). Every change is a CSRF-checked POST
from the gateway's own origin, and is in the audit trail. The console lives outside `/v1` (it is not part of
the REST API or its OpenAPI document); the Guard lets `/console` through without a bearer token: the
console's own session stands in for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from worker.connections import async_client, sync_client
from worker.gateway.calls import Calls
from worker.gateway.console.gate import Gate
from worker.gateway.console.pages import Console
from worker.gateway.console.sessions import Sessions
from worker.gateway.console.sources import Extensions
from worker.gateway.identity.principals import StaticTokens
from worker.settings import Settings
from worker.upstreams.operate import Operator

__all__ = ["Console", "Extensions", "open_console"]


@asynccontextmanager
async def open_console(
    settings: Settings, calls: Calls, tokens: StaticTokens, tokenless: bool, extensions: Extensions | None = None
) -> AsyncIterator[Console]:
    """The console on `settings.redis_url` (a client of its own, and a synchronous one on each shard for the
    figures `toolworker queue` reads); `extensions`: the approvals and connections it shows, when there are."""
    redis_async = async_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
    shards = [
        (shard, sync_client(shard.url, socket_connect_timeout=5, socket_timeout=30)) for shard in settings.shards.all
    ]
    gate = Gate(
        Sessions(redis_async, settings.console_session_ttl_seconds), tokens, tokenless, settings.gateway_public_url
    )
    try:
        timeout_s = settings.gateway_call_timeout_seconds
        yield Console(calls, gate, shards, redis_async, timeout_s, extensions, Operator(settings).accept)
    finally:
        for _, client in shards:
            client.close()
        await redis_async.aclose()
