"""The upstreams page: each upstream's kind, the protocol its MCP server negotiated, its tools, its last
refresh and error (an MCP server down at its last refresh is marked unavailable: it keeps its last tools), and
for `pin: true` upstreams the tools withheld until accepted, each with an Accept button (the same acceptance as
`toolworker upstreams accept` and REST `POST /v1/upstreams/{name}/accept`, audited the same way)."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from worker.definitions import listings
from worker.definitions.mcp_tools import Listing
from worker.gateway.calls import Calls
from worker.gateway.console.sessions import Session
from worker.gateway.console.views import UPSTREAMS, Room
from worker.upstreams.operate import rows

# Accept the withheld tools of an upstream (one by the server's name, or all): the listing as stored then.
Accept = Callable[[str, str | None], Awaitable[Listing]]


class UpstreamPages(Room):
    def __init__(
        self, calls: Calls, links: Sequence[tuple[str, str]], redis_async: aioredis.Redis, accept: Accept
    ) -> None:
        super().__init__(calls, links)
        self._redis = redis_async
        self._accept = accept

    async def upstreams(self, request: Request, session: Session) -> Response:
        toolset = self.calls.catalog.snapshot.toolset
        found = await listings.read_async(self._redis)
        shown = [
            _shown(row, toolset.upstreams[row["name"]].mcp, found.get(row["name"])) for row in rows(toolset, found)
        ]
        accepted = request.query_params.get("accepted", "")
        return self._view("upstreams.html", session, nav="Upstreams", rows=shown, accepted=accepted)

    async def accept(self, request: Request, session: Session, form: FormData) -> Response:
        name = request.path_params["name"]
        tool = form.get("tool")
        one = tool if isinstance(tool, str) and tool else None
        try:
            await self._accept(name, one)
        except KeyError as exc:
            return self._view("message.html", session, 404, title="Nothing to accept", message=str(exc.args[0]))
        self._audit(session, "upstream.accept", name, one or "every withheld tool")
        return RedirectResponse(f"{UPSTREAMS}?accepted={name}", 303)


def _shown(row: dict[str, Any], mcp: Any, listing: Listing | None) -> dict[str, Any]:
    """A row as the page shows it: times as UTC, whether it is pinned, what waits (with what changed)."""
    pending = listing.pending if listing is not None else {}
    served = listing.tools if listing is not None else {}
    waiting = [{"tool": name, "state": "changed" if name in served else "new"} for name in sorted(pending)]
    return {
        **row,
        "pin": bool(mcp is not None and mcp.pin),
        "listed": _when(row.get("listedAt")),
        "tried": _when(row.get("triedAt")),
        "unavailable": row["kind"] == "mcp" and not row.get("available"),
        "waiting": waiting,
    }


def _when(stamp: object) -> str:
    if not isinstance(stamp, int | float):
        return ""
    return datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
