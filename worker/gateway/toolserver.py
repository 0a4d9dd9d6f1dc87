"""XAgent ToolServer-compatible routes under `/toolserver`, so XAgent-style agents keep their client.

Every route is a POST with a JSON body, as ToolServer's. Both field spellings are accepted: the
documented ones (`tools`, `envs`, `tool` + `parameters`) and those XAgent's own client sends
(`tool_names`, `env_names`, `tool_name` + `arguments`); a bare JSON list works for the name lists, as
FastAPI's single-body routes take it. Envs are the upstreams, each with its tools (at most 50 listed).
`tools_json` entries have OpenAI's function shape (`name`, `description`, `parameters`).

Status codes as ToolServer's clients read them: 200 the tool's output (its JSON, or the text as a JSON
string), 404 unknown tool, 422 invalid arguments (exit 65; the envelope in the body), 450 no output
yet (ToolServer's "output not ready": the call is still queued or running), 500 a failed call (the
envelope in the body), 503 the fleet cannot take calls. Errors carry FastAPI's `detail`. Sessions
(`get_cookie`, `close_session`, `release_session`) are accepted and carry nothing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.definitions import catalog
from worker.envelope import ToolResult
from worker.errors import TenantQueueFull, UnknownTool
from worker.gateway import metrics
from worker.gateway.calls import QUEUE_FULL_RETRY_AFTER_S, Calls, CallSpec
from worker.gateway.catalog import Snapshot
from worker.gateway.health import FleetUnavailable
from worker.gateway.identity.principals import access_token_of, principal_of
from worker.gateway.rest.bodies import BadBody, json_body, loads

MAX_ENV_TOOLS_SHOWN = 50
NOT_READY = 450
INVALID_ARGUMENTS_EXIT = 65
SESSION_COOKIE = "node_id"


def _detail(status: int, detail: Any, **extra: Any) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status)


Handler = Callable[[Request], Awaitable[Response]]


def guarded(handler: Handler) -> Handler:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except BadBody as exc:
            return _detail(422 if exc.status == 422 else 400, exc.message)
        except UnknownTool as exc:
            return _detail(404, str(exc))
        except FleetUnavailable as exc:
            return _detail(503, f"The tool fleet cannot take calls now: {exc}")
        except TenantQueueFull as exc:
            response = _detail(429, exc.message)
            response.headers["Retry-After"] = str(QUEUE_FULL_RETRY_AFTER_S)
            return response

    return run


class ToolServer:
    def __init__(self, calls: Calls, timeout_s: float, version: str) -> None:
        self.calls = calls
        self.timeout_s = timeout_s
        self.version = version

    def routes(self) -> list[Route]:
        handlers = {
            "get_cookie": self.get_cookie,
            "close_session": self.close_session,
            "release_session": self.release_session,
            "get_available_tools": self.get_available_tools,
            "retrieving_tools": self.retrieving_tools,
            "get_json_schema_for_tools": self.schema_for_tools,
            "get_json_schema_for_envs": self.schema_for_envs,
            "execute_tool": self.execute_tool,
        }
        return [Route(f"/toolserver/{name}", guarded(h), methods=["POST"]) for name, h in handlers.items()]

    # --- sessions: accepted, carrying nothing -----------------------------------------------------

    async def get_cookie(self, request: Request) -> Response:
        response = JSONResponse({"message": "add cookie", "version": self.version})
        response.headers["Server"] = f"toolworker/{self.version}"
        response.set_cookie(SESSION_COOKIE, uuid.uuid4().hex, httponly=True, samesite="strict")
        return response

    async def close_session(self, request: Request) -> Response:
        return JSONResponse(f"Close session: {request.cookies.get(SESSION_COOKIE)}")

    async def release_session(self, request: Request) -> Response:
        return JSONResponse(f"Release session: {request.cookies.get(SESSION_COOKIE)}")

    # --- the catalog ------------------------------------------------------------------------------

    async def get_available_tools(self, request: Request) -> Response:
        snapshot = self.calls.visible(principal_of(request.scope))
        return JSONResponse(
            {
                "available_envs": [_env(snapshot, name, MAX_ENV_TOOLS_SHOWN) for name in _envs(snapshot)],
                "available_tools": list(snapshot.names),
                "tools_json": _functions(snapshot, snapshot.names),
            }
        )

    async def retrieving_tools(self, request: Request) -> Response:
        body = await json_body(request)
        question = body.get("question") if isinstance(body, dict) else None
        top_k = body.get("top_k", 5) if isinstance(body, dict) else 5
        if not isinstance(question, str) or not question.strip():
            raise BadBody(422, "`question` is required (a non-empty string).")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise BadBody(422, "`top_k` must be a positive integer.")
        snapshot = self.calls.visible(principal_of(request.scope))
        names = [row["name"] for row in catalog.search(snapshot.toolset, question, min(top_k, 50))]
        return JSONResponse({"retrieved_tools": names, "tools_json": _functions(snapshot, names)})

    async def schema_for_tools(self, request: Request) -> Response:
        names = _names(await json_body(request), "tools", "tool_names")
        snapshot = self.calls.visible(principal_of(request.scope))
        found = [n for n in names if snapshot.tool(n) is not None]
        return JSONResponse({"tools_json": _functions(snapshot, found), "missing_tools": _missing(names, found)})

    async def schema_for_envs(self, request: Request) -> Response:
        names = _names(await json_body(request), "envs", "env_names")
        snapshot = self.calls.visible(principal_of(request.scope))
        envs = _envs(snapshot)
        found = [n for n in names if n in envs]
        return JSONResponse(
            {"envs_json": [_env(snapshot, n, None) for n in found], "missing_envs": _missing(names, found)}
        )

    # --- calls ------------------------------------------------------------------------------------

    async def execute_tool(self, request: Request) -> Response:
        name, arguments, env = _execution(await json_body(request))
        principal = principal_of(request.scope)
        tool = self.calls.resolve(name, principal)
        if env is not None and tool.upstream != env:
            raise UnknownTool(f"{env}/{name}")
        started = time.perf_counter()
        subject_token = access_token_of(request.scope)
        spec = CallSpec(
            name, arguments, request.headers, None, self.timeout_s, principal=principal, subject_token=subject_token
        )
        submitted = await self.calls.submit(spec)
        parked = self.calls.needs_approval(tool)  # it waits for a human: nothing to wait for here
        envelope = None if parked else await self.calls.answer(submitted, self.timeout_s)
        metrics.observe("toolserver", envelope, time.perf_counter() - started)
        if envelope is None:
            self.calls.hold(submitted)
        return _outcome(envelope, submitted.call_id, parked)


def _outcome(envelope: ToolResult | None, call_id: str, parked: bool = False) -> Response:
    if envelope is None:
        waits = f" (it waits for a human's approval: POST /v1/approvals/{call_id})" if parked else ""
        return _detail(
            NOT_READY, f"The call {call_id} has no output yet{waits}; fetch it later with GET /v1/calls/{call_id}."
        )
    if envelope.exit_code == 0:
        return _output(envelope.result)
    status = 422 if envelope.exit_code == INVALID_ARGUMENTS_EXIT else 500
    message = (envelope.error or {}).get("message") or f"The call failed (exit code {envelope.exit_code})."
    return _detail(status, message, envelope=envelope.to_dict())


def _output(text: str) -> Response:
    """The tool's output: its JSON as it is, or the text as a JSON string."""
    try:
        json.loads(text)
    except ValueError:
        return JSONResponse(text)
    return Response(text, media_type="application/json")


def _execution(body: Any) -> tuple[str, dict[str, Any], str | None]:
    if not isinstance(body, dict):
        raise BadBody(422, "The body must be a JSON object with `tool_name` (or `tool`) and `arguments`.")
    name = body.get("tool_name", body.get("tool"))
    arguments = body.get("arguments", body.get("parameters", {}))
    env = body.get("env_name")
    if isinstance(arguments, str):  # XAgent's client may pass the model's arguments text as it came
        try:
            arguments = loads(arguments.encode(), "`arguments`")
        except BadBody as exc:  # the body was JSON: this field of it is of the wrong shape
            raise BadBody(422, exc.message) from None
    if not isinstance(name, str) or not name:
        raise BadBody(422, "`tool_name` (or `tool`) is required.")
    if not isinstance(arguments, dict):
        raise BadBody(422, "`arguments` (or `parameters`) must be a JSON object.")
    if env is not None and not isinstance(env, str):
        raise BadBody(422, "`env_name` must be a string.")
    return name, arguments, env


def _names(body: Any, documented: str, xagent: str) -> list[str]:
    names = body.get(documented, body.get(xagent)) if isinstance(body, dict) else body
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadBody(422, f"`{documented}` (or `{xagent}`) must be a list of names.")
    return list(dict.fromkeys(names))


def _missing(names: list[str], found: list[str]) -> list[str]:
    return [n for n in names if n not in set(found)]


def _functions(snapshot: Snapshot, names: Any) -> list[dict[str, Any]]:
    tools = [snapshot.toolset.tools[n] for n in names if n in snapshot.toolset.tools]
    return [entry["function"] for entry in catalog.to_openai(tools)]


def _envs(snapshot: Snapshot) -> dict[str, list[str]]:
    """Upstream -> the names of its tools, for upstreams with at least one."""
    envs: dict[str, list[str]] = {}
    for name in snapshot.names:
        envs.setdefault(snapshot.toolset.tools[name].upstream, []).append(name)
    return envs


def _env(snapshot: Snapshot, upstream: str, shown: int | None) -> dict[str, Any]:
    names = _envs(snapshot)[upstream]
    listed = names if shown is None or len(names) <= shown else [*names[:shown], "..."]
    return {
        "name": upstream,
        "description": f"The tools of the upstream {upstream!r} ({len(names)}).",
        "total_tools": len(names),
        "tools": listed,
    }
