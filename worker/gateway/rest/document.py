"""The OpenAPI 3.1 document of the REST API, served at `/v1/openapi.json`, generated from the routes' table.

FastAPI's generator reads each operation's handler the way it reads a path operation (its `body`, `query`
and path parameters, typed with models.py) and its answers, and writes the parameters, request bodies and
component schemas; this module adds what is the gateway's own: the bearer scheme, with an empty alternative
for a gateway without tokens, and `security: []` on the open routes. Other agent platforms import the
gateway from it, and so does `toolworker import-openapi` (one tool per operation, named by operationId).
"""

from __future__ import annotations

import copy
import inspect
import re
from functools import cache
from typing import Any

from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from worker.gateway.rest import connections, routes, upstreams
from worker.gateway.rest.operations import Answer, Operation

JSON = dict[str, Any]
OPERATIONS = [*routes.OPERATIONS, *connections.OPERATIONS, *upstreams.OPERATIONS]
TITLE = "toolworker gateway"
DESCRIPTION = "Tool calls for LLM agents, run by a fleet of workers through a queue."
BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "A token of TOOLWORKER_GATEWAY_TOKENS or of the access file, or an OAuth 2.1 access token. "
    "A gateway started without any (`make run`) binds to loopback only and needs no Authorization header.",
}
# FastAPI's own answer to bad inputs, which the gateway does not give (operations.py answers its own).
_FASTAPI_SCHEMAS = ("HTTPValidationError", "ValidationError")


def document(server_url: str, version: str) -> JSON:
    """The document, with its server and version (a copy: the caller may change it)."""
    return {**copy.deepcopy(_generated(version)), "servers": [{"url": server_url}]}


@cache
def _generated(version: str) -> JSON:
    doc = get_openapi(
        title=TITLE,
        version=version,
        openapi_version="3.1.0",
        description=DESCRIPTION,
        routes=[_route(op) for op in OPERATIONS],
    )
    for op, item in zip(OPERATIONS, _operations(doc), strict=True):
        item["responses"] = {str(status): _answer(op, status, item) for status in op.answers}
    for name in _FASTAPI_SCHEMAS:
        doc["components"]["schemas"].pop(name, None)
    # A gateway without tokens (`make run`: TOOLWORKER_GATEWAY_TOKENS empty, no access file) serves loopback
    # only and asks for no Authorization: hence the empty alternative.
    doc["security"] = [{"bearer": []}, {}]
    doc["components"]["securitySchemes"] = {"bearer": BEARER}
    return doc


def _route(op: Operation) -> APIRoute:
    """The operation as FastAPI reads one: its handler's signature (without the instance and the request)."""
    return APIRoute(
        op.path,
        _Described(op),
        methods=[op.method],
        operation_id=op.operation_id,
        summary=op.summary,
        tags=["toolworker"],
        response_model=None,
        responses={status: _response(answer) for status, answer in op.answers.items()},
        openapi_extra={"security": []} if op.open else None,
    )


class _Described:
    """What FastAPI reads of an operation: a callable whose signature is the handler's inputs (without the
    instance and the request). Never called: operations.py serves the handler."""

    def __init__(self, op: Operation) -> None:
        kind = inspect.Parameter.KEYWORD_ONLY
        parameters = [inspect.Parameter(name, kind, annotation=hint) for name, hint in op.inputs.items()]
        self.__signature__ = inspect.Signature(parameters)
        self.__name__ = op.operation_id
        self.__doc__ = None  # FastAPI would take the class's docstring as the operation's description

    async def __call__(self, **inputs: Any) -> None:
        raise NotImplementedError


def _response(answer: Answer) -> JSON:
    if answer.model is None or answer.media_type != "application/json":
        return {"description": answer.description}
    return {"description": answer.description, "model": answer.model}


def _answer(op: Operation, status: int, generated: JSON) -> JSON:
    """What FastAPI wrote for a status the operation answers with, in the media type it answers in."""
    answer = op.answers[status]
    written = generated["responses"].get(str(status), {})
    if answer.media_type == "application/json" and answer.model is not None:
        return {
            "description": answer.description,
            "content": {"application/json": written["content"][answer.media_type]},
        }
    if answer.media_type:
        return {"description": answer.description, "content": {answer.media_type: {"schema": {"type": "string"}}}}
    return {"description": answer.description}


def _operations(doc: JSON) -> list[JSON]:
    """The document's operations, in the order of the table."""
    return [doc["paths"][re.sub(r"\{(\w+):\w+\}", r"{\1}", op.path)][op.method.lower()] for op in OPERATIONS]
