"""The REST routes as data: an operation is a typed handler and what the document says of it, in one place.

A handler takes the request and its inputs as parameters typed the way FastAPI reads a path operation:
`body: Annotated[Model, Body()]` (the JSON body), `query: Annotated[Model, Query()]` (the query string) and
each path parameter by name (`Annotated[str, Path(...)]`). `served` makes a Starlette route of it that reads
those inputs with the same types, and turns bad ones and the gateway's errors into the API's JSON errors
(`{"error": {"type", "message"}}`); document.py gives the same handlers to FastAPI's OpenAPI generator. The
routes and the document read one table, so they cannot disagree. A new route is a handler and one entry.
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import params
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.errors import CallbackRefused, TenantQueueFull, UnknownTool
from worker.gateway.calls import QUEUE_FULL_RETRY_AFTER_S, CallIdConflict
from worker.gateway.decisions import NotAllowed
from worker.gateway.health import FleetUnavailable
from worker.gateway.rest.bodies import BadBody, json_body, parse, problems_of
from worker.queue.approvals import NotParked

Handler = Callable[..., Awaitable[Response]]


@dataclass(frozen=True)
class Answer:
    """One status an operation answers with: what it means, and the shape of its body (a model, a JSON
    Schema, or None for no body)."""

    description: str
    model: Any = None
    media_type: str = "application/json"


@dataclass(frozen=True)
class Operation:
    """A route of the REST API: method, path (Starlette's syntax, convertors included), the handler (a
    function of the class that serves it), and its operationId, summary and answers by status."""

    method: str
    path: str
    handler: Handler
    operation_id: str
    summary: str
    answers: Mapping[int, Answer]
    # No bearer token: a browser's page, or the health check.
    open: bool = False
    # What bad inputs get instead of the JSON error (a browser's page).
    refuse: Callable[[BadBody], Response] | None = None
    inputs: Mapping[str, Any] = field(init=False, compare=False)
    _paths: Mapping[str, TypeAdapter[Any]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(self.handler, include_extras=True)
        taken = {name: hint for name, hint in hints.items() if name not in {"self", "request", "return"}}
        paths = {name: TypeAdapter(hint) for name, hint in taken.items() if isinstance(_where(hint), params.Path)}
        object.__setattr__(self, "inputs", taken)
        object.__setattr__(self, "_paths", paths)

    async def read_inputs(self, request: Request) -> dict[str, Any]:
        """The handler's inputs, each read and checked with its own type; BadBody (400 or 422) otherwise."""
        inputs: dict[str, Any] = {}
        for name, hint in self.inputs.items():
            model, marker = typing.get_args(hint)[:2]
            if isinstance(marker, params.Path):
                inputs[name] = _path_parameter(name, self._paths[name], request.path_params[name])
            elif isinstance(marker, params.Body):
                inputs[name] = parse(model, await json_body(request))
            else:
                inputs[name] = parse(model, _query(model, request.query_params), "The query")
        return inputs


def _where(hint: Any) -> Any:
    """FastAPI's marker of an input (`Body()`, `Query()`, `Path()`): where it is read from."""
    return typing.get_args(hint)[1]


def error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, **extra}}, status_code=status)


def served(operations: list[Operation], owner: object) -> list[Route]:
    """The Starlette routes of `operations`, their handlers bound to `owner`."""
    return [Route(op.path, _endpoint(op, owner), methods=[op.method]) for op in operations]


def _endpoint(op: Operation, owner: object) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            inputs = await op.read_inputs(request)
        except BadBody as exc:
            if op.refuse is not None:
                return op.refuse(exc)
            raise
        return await op.handler(owner, request, **inputs)

    return guarded(run)


def _query(model: type[BaseModel], query: QueryParams) -> dict[str, Any]:
    """The query parameters a model names: a list field takes every value of its name, others the last."""
    return {
        name: query.getlist(name) if typing.get_origin(info.annotation) is list else query[name]
        for name, info in model.model_fields.items()
        if name in query
    }


def _path_parameter(name: str, adapter: TypeAdapter[Any], raw: str) -> Any:
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        problems = problems_of(exc, whole=name)
        raise BadBody(422, f"The path parameter `{name}` is invalid: {problems[0]['message']}.", problems) from None


def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Turn the gateway's errors into their JSON answers, in one place."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except BadBody as exc:
            return error(exc.status, "invalid_request", exc.message, problems=exc.problems)
        except UnknownTool as exc:
            return error(404, "unknown_tool", str(exc))
        except CallIdConflict as exc:
            return error(409, "call_id_conflict", str(exc))
        except FleetUnavailable as exc:
            return error(503, "unavailable", f"The tool fleet cannot take calls now: {exc}")
        except CallbackRefused as exc:
            return error(403, "callback_refused", exc.message)
        except TenantQueueFull as exc:
            response = error(429, exc.type, exc.message, tenant=exc.tenant, maxQueued=exc.limit)
            response.headers["Retry-After"] = str(QUEUE_FULL_RETRY_AFTER_S)
            return response
        except NotAllowed as exc:
            return error(403, "forbidden", str(exc))
        except NotParked as exc:
            return error(404 if exc.state is None else 409, "not_parked", str(exc), state=exc.state)

    return run
