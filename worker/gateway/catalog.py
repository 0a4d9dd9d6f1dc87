"""The tools the gateway offers: what the workers serve, optionally a tagged subset, version after version.

With the file store, the gateway serves the files the workers announced they serve (redis_store.announce),
never a folder of its own that may differ: its own `TOOLWORKER_DEFINITIONS` is read only while no
worker has announced any (a gateway started first), and a warning says so. With the Redis store the
current published version is served. Either way the source is polled (`TOOLWORKER_STORE_POLL_SECONDS`,
like the workers) and each change replaces the snapshot; listeners hear of it, so MCP clients learn
that the tool list changed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from worker.connections import sync_client
from worker.definitions import builtin, catalog, file_store, listings, redis_store
from worker.definitions.mcp_tools import Listing, unlisted_tool, with_listings
from worker.definitions.model import Tool, ToolSet, Upstream
from worker.gateway.identity.principals import Grant
from worker.http.egress import EgressPolicy
from worker.settings import Settings

log = structlog.get_logger("toolworker.gateway.catalog")
JSON = Any


def served_toolset(toolset: ToolSet, settings: Settings) -> ToolSet:
    """The toolset the workers serve from these definitions (built-in catalog tools included)."""
    return builtin.served_toolset(toolset, EgressPolicy.parse(settings.egress_allow).enabled, settings.code_mode)


def with_tags(toolset: ToolSet, tags: Iterable[str]) -> ToolSet:
    """Only the tools that have one of `tags` (all of them when `tags` is empty)."""
    wanted = frozenset(tags)
    if not wanted:
        return toolset
    tools = {name: tool for name, tool in toolset.tools.items() if wanted & set(tool.tags)}
    unlisted = tuple(name for name in toolset.unlisted if name in wanted)  # an MCP upstream's tag is its name
    return ToolSet(dict(toolset.upstreams), tools, list(toolset.problems), dict(toolset.unusable), unlisted=unlisted)


@dataclass
class Snapshot:
    """One version of the offered tools, in a stable order (by name)."""

    version: int
    toolset: ToolSet
    names: tuple[str, ...] = ()
    _mcp: dict[str, dict[str, JSON]] = field(default_factory=dict, repr=False)
    _views: dict[Grant, Snapshot] = field(default_factory=dict, repr=False)
    grant: Grant | None = field(default=None, repr=False)  # a scoped view's grant

    def __post_init__(self) -> None:
        self.names = tuple(sorted(self.toolset.tools))

    def scoped(self, grant: Grant) -> Snapshot:
        """What of this version a grant allows, built once per grant (the principals of a grant share it)."""
        if grant.everything:
            return self
        view = self._views.get(grant)
        if view is None:
            tools = {name: tool for name, tool in self.toolset.tools.items() if grant.allows(tool)}
            view = Snapshot(self.version, ToolSet(dict(self.toolset.upstreams), tools, unlisted=self.toolset.unlisted))
            view.grant = grant
            self._views[grant] = view
        return view

    def tool(self, name: str) -> Tool | None:
        """The tool of this name; else, on an MCP upstream not listed yet, the one its prefix names (when the
        grant allows it)."""
        tool = self.toolset.tools.get(name)
        if tool is not None or not self.toolset.unlisted:
            return tool
        tool = unlisted_tool(self.toolset, name)
        return tool if tool is not None and (self.grant is None or self.grant.allows(tool)) else None

    def upstream(self, tool: Tool) -> Upstream:
        return self.toolset.upstreams[tool.upstream]

    def after(self, last: str | None, limit: int) -> tuple[list[str], str | None]:
        """A page of names after `last` (keyset order: a change between pages skips or repeats none of the
        others), and the last name of the page when more follow."""
        start = 0 if last is None else _bisect_right(self.names, last)
        page = list(self.names[start : start + limit])
        more = start + limit < len(self.names)
        return page, (page[-1] if more and page else None)

    def mcp_tools(self, names: Iterable[str]) -> list[dict[str, JSON]]:
        """MCP `tools/list` entries, each built once per snapshot (a lazy OpenAPI schema on first use)."""
        missing = [n for n in names if n not in self._mcp and n in self.toolset.tools]
        for entry in catalog.to_mcp(self.toolset.tools[n] for n in missing):
            self._mcp[entry["name"]] = entry
        return [self._mcp[n] for n in names if n in self._mcp]

    def tags(self) -> dict[str, int]:
        """Every tag with how many tools carry it."""
        counts: dict[str, int] = {}
        for tool in self.toolset.tools.values():
            for tag in tool.tags:
                counts[tag] = counts.get(tag, 0) + 1
        return dict(sorted(counts.items()))


def _bisect_right(names: tuple[str, ...], last: str) -> int:
    low, high = 0, len(names)
    while low < high:
        middle = (low + high) // 2
        if names[middle] <= last:
            low = middle + 1
        else:
            high = middle
    return low


class Catalog:
    """The current snapshot, followed across published versions when the store is Redis."""

    def __init__(self, settings: Settings, tags: Iterable[str] = ()) -> None:
        self._settings = settings
        self._tags = tuple(tags)
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._watcher: asyncio.Task[None] | None = None
        self._loaded = False
        self.snapshot = Snapshot(0, ToolSet())
        # The definitions as loaded, and the MCP upstreams' listings served with them (followed in Redis).
        self._defined: tuple[int, ToolSet, str | None] = (0, ToolSet(), None)
        self._listings: dict[str, Listing] = {}
        self._listings_watcher: asyncio.Task[None] | None = None

    @property
    def ttl_ms(self) -> int:
        """How long a client may keep a tool list: until the next look for a new version."""
        return int(self._settings.store_poll_seconds * 1000)

    def on_change(self, listener: Callable[[Snapshot], None]) -> None:
        self._listeners.append(listener)

    async def start(self, client: aioredis.Redis) -> None:
        with contextlib.suppress(RedisError):
            self._listings = await listings.read_async(client)
        follow = listings.follow(client, -1, self._settings.store_poll_seconds, self._relist, self._serves_mcp)
        self._listings_watcher = asyncio.get_running_loop().create_task(follow)
        if self._settings.store == "file":
            await self._start_announced(client)
            return
        bundles = redis_store.Bundles()
        payload = await asyncio.to_thread(_current_payload, self._settings.redis_url)
        if payload is None:
            log.warning("gateway.no_definitions_published", hint="run `toolworker publish`")
        else:
            self._replace(*await asyncio.to_thread(bundles.load, payload))
        poll_s = self._settings.store_poll_seconds
        watch = redis_store.follow(client, bundles, self.snapshot.version, poll_s, self._replace)
        self._watcher = asyncio.get_running_loop().create_task(watch)

    async def _start_announced(self, client: aioredis.Redis) -> None:
        """The file store: serve the files the workers announced, and each set they announce later."""
        bundles = redis_store.Bundles()
        served = 0  # the sets served so far, which name their folders in `bundles`

        async def serve(digest: str, files: dict[str, str]) -> None:
            nonlocal served
            served += 1
            # Version 0 as for any file store: the number names a published version, and there is none.
            self._replace(0, await asyncio.to_thread(bundles.load_files, served, files), digest)

        try:
            announced = await redis_store.announced_files(client)
        except RedisError as exc:  # Redis away at start: the follower below takes the announcement later
            log.warning("gateway.definitions_unread", error=str(exc))
            announced = None
        if announced is None:
            await self._serve_own_folder()
        else:
            await serve(*announced)
        watch = redis_store.follow_announced(
            client, announced and announced[0], self._settings.store_poll_seconds, serve
        )
        self._watcher = asyncio.get_running_loop().create_task(watch)

    async def _serve_own_folder(self) -> None:
        folder = self._settings.definitions
        log.warning(
            "gateway.no_worker_definitions",
            definitions=str(folder.resolve()),
            reason="no worker on the file store has announced the definitions it serves: serving this folder "
            "until one does",
        )
        self._replace(0, await asyncio.to_thread(file_store.load, [folder]))

    async def close(self) -> None:
        for watcher in (self._watcher, self._listings_watcher):
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    def _serves_mcp(self) -> bool:
        return listings.has_mcp(self._defined[1])

    def _relist(self, found: dict[str, Listing]) -> None:
        """Serve the MCP upstreams' newly stored listings (clients hear that the tools changed)."""
        if found != self._listings:
            self._listings = found
            self._replace(*self._defined)

    def _replace(self, version: int, toolset: ToolSet, digest: str | None = None) -> None:
        changed, self._loaded = self._loaded, True
        self._defined = (version, toolset, digest)
        served = served_toolset(with_listings(toolset, self._listings), self._settings)
        self.snapshot = Snapshot(version, with_tags(served, self._tags))
        tools, tags = len(self.snapshot.names), list(self._tags)
        log.info("gateway.definitions_loaded", version=version, digest=digest, tools=tools, tags=tags)
        if changed:  # the first load changes nothing a client has seen
            for listener in self._listeners:
                listener(self.snapshot)


def _current_payload(redis_url: str) -> bytes | None:
    client = sync_client(redis_url, socket_connect_timeout=5)
    try:
        return redis_store.current_payload(client)
    finally:
        client.close()
