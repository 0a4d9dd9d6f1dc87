"""The REST API's upstreams and their table of operations: `GET /v1/upstreams` (kind, protocol negotiated,
tools, last refresh, last error), and, with the grant `operate`, `POST /v1/upstreams/{name}/refresh` (read an
MCP upstream's tools now) and `POST /v1/upstreams/{name}/accept` (serve what `pin: true` withheld; the body's
`tool`, the server's own name for it, for one)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Path
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.definitions import listings
from worker.gateway.calls import Calls
from worker.gateway.identity.principals import principal_of
from worker.gateway.rest.models import Error
from worker.gateway.rest.operations import Answer, Operation, error, served
from worker.gateway.rest.routes import ERRORS
from worker.settings import Settings
from worker.upstreams.operate import Operator, rows


class UpstreamRow(BaseModel):
    """One upstream: its kind (`http` or `mcp`) and tools; an MCP upstream's listing as last stored."""

    model_config = ConfigDict(extra="allow")

    name: str
    kind: str
    tools: int


class UpstreamList(BaseModel):
    upstreams: list[UpstreamRow]


class Listing(BaseModel):
    """An MCP upstream's listing: tools served, those withheld, protocol, when listed and tried, last error."""

    model_config = ConfigDict(extra="allow")

    upstream: str
    tools: int
    pending: list[str]
    available: bool
    error: str | None = None


class Acceptance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str | None = Field(None, description="The server's own name of the one tool to accept; all when absent.")


UpstreamName = Annotated[str, Path(min_length=1)]
_OPERATE = "needs the grant `operate`"


class Upstreams:
    def __init__(self, calls: Calls, settings: Settings) -> None:
        self.calls = calls
        self.operator = Operator(settings)

    def routes(self) -> list[Route]:
        return served(OPERATIONS, self)

    async def list_upstreams(self, request: Request) -> Response:
        found = await listings.read_async(self.calls.redis)
        return JSONResponse({"upstreams": rows(self.calls.catalog.snapshot.toolset, found)})

    async def refresh(self, request: Request, name: UpstreamName) -> Response:
        if not principal_of(request.scope).grant.may("operate"):
            return error(403, "forbidden", f"Refreshing an upstream {_OPERATE}.")
        try:
            listing = await self.operator.refresh(self.calls.catalog.snapshot.toolset, name)
        except KeyError as exc:
            return error(404, "unknown_upstream", str(exc.args[0]))
        return _listed(name, listing.summary())

    async def accept(self, request: Request, name: UpstreamName, body: Annotated[Acceptance, Body()]) -> Response:
        if not principal_of(request.scope).grant.may("operate"):
            return error(403, "forbidden", f"Accepting an upstream's tools {_OPERATE}.")
        try:
            listing = await self.operator.accept(name, body.tool)
        except KeyError as exc:
            return error(404, "nothing_to_accept", str(exc.args[0]))
        return _listed(name, listing.summary())


def _listed(name: str, summary: dict[str, Any]) -> Response:
    return JSONResponse({"upstream": name, **summary})


_FORBIDDEN = Answer("The principal's grants lack `operate`.", Error)
OPERATIONS = [
    Operation(
        "GET",
        "/v1/upstreams",
        Upstreams.list_upstreams,
        "listUpstreams",
        "The upstreams: kind, tools, and an MCP upstream's protocol, last refresh and last error",
        {200: Answer("Every upstream, by name.", UpstreamList), **ERRORS},
    ),
    Operation(
        "POST",
        "/v1/upstreams/{name}/refresh",
        Upstreams.refresh,
        "refreshUpstream",
        "Read an MCP upstream's tools now (a server that fails keeps its last tools)",
        {
            200: Answer("The listing as stored now.", Listing),
            403: _FORBIDDEN,
            404: Answer("No MCP upstream of this name.", Error),
            **ERRORS,
        },
    ),
    Operation(
        "POST",
        "/v1/upstreams/{name}/accept",
        Upstreams.accept,
        "acceptUpstreamTools",
        "Serve the tools `pin: true` withheld (one, or all of them)",
        {
            200: Answer("The listing as stored now.", Listing),
            403: _FORBIDDEN,
            404: Answer("Nothing of this upstream waits to be accepted.", Error),
            **ERRORS,
        },
    ),
]
