"""The REST API's upstreams: `GET /v1/upstreams` (kind, protocol negotiated, tools, last refresh, last error),
and, with the grant `operate`, `POST /v1/upstreams/{name}/refresh` (read an MCP upstream's tools now) and
`POST /v1/upstreams/{name}/accept` (serve what `pin: true` withheld; body `{"tool": NAME}` for one)."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.definitions import listings
from worker.gateway.calls import Calls
from worker.gateway.identity.principals import principal_of
from worker.gateway.rest.routes import error
from worker.settings import Settings
from worker.upstreams.operate import Operator, rows


class Upstreams:
    def __init__(self, calls: Calls, settings: Settings) -> None:
        self.calls = calls
        self.operator = Operator(settings)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/upstreams", self.list_upstreams, methods=["GET"]),
            Route("/v1/upstreams/{name}/refresh", self.refresh, methods=["POST"]),
            Route("/v1/upstreams/{name}/accept", self.accept, methods=["POST"]),
        ]

    async def list_upstreams(self, request: Request) -> Response:
        found = await listings.read_async(self.calls.redis)
        return JSONResponse({"upstreams": rows(self.calls.catalog.snapshot.toolset, found)})

    async def refresh(self, request: Request) -> Response:
        if not principal_of(request.scope).grant.may("operate"):
            return error(403, "forbidden", "Refreshing an upstream needs the grant `operate`.")
        name = request.path_params["name"]
        try:
            listing = await self.operator.refresh(self.calls.catalog.snapshot.toolset, name)
        except KeyError as exc:
            return error(404, "unknown_upstream", str(exc.args[0]))
        return JSONResponse({"upstream": name, **listing.summary()})

    async def accept(self, request: Request) -> Response:
        if not principal_of(request.scope).grant.may("operate"):
            return error(403, "forbidden", "Accepting an upstream's tools needs the grant `operate`.")
        raw = await request.body()
        tool = json.loads(raw).get("tool") if raw.strip() else None
        try:
            listing = await self.operator.accept(request.path_params["name"], tool)
        except KeyError as exc:
            return error(404, "nothing_to_accept", str(exc.args[0]))
        return JSONResponse({"upstream": request.path_params["name"], **listing.summary()})
