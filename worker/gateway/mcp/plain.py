"""The plain `tools/call`: a 2026-07-28 request answered as JSON without the SDK's per-request machinery.

Most MCP traffic through the gateway is one shape: a 2026-07-28 POST, no session, one `tools/call` that
asks for no stream (no progress, no log messages, no task status). The SDK's modern entry gives each such
request a runner, a middleware chain, an anyio cancel scope and four pydantic passes (the JSON-RPC
envelope in, the params, the result against the revision's surface, the envelope out): an MCP call cost
the gateway a third to a half more CPU than the same call over REST, a quarter of it in that path
(benchmarks/README.md). Tracing on, the SDK's path serves every request (its span covers them).

Here that shape is answered by the same handler (McpFront.call_tool, through the same context the SDK
would build: its Connection, ServerSession and dispatch context), after the SDK's own checks of what such
a request must be: the Content-Type and Accept rules, the routing headers not repeated, and
`classify_inbound_request`'s ladder (the `_meta` envelope, `MCP-Protocol-Version`/`Mcp-Method`/`Mcp-Name`
against the body, the revision); then the params' surface check and model, as the SDK's runner does. A
request that fails any of them, or is any other shape, goes to the SDK untouched: every rejection and every
transport error is the SDK's answer. The result goes through the SDK's surface sieve for `tools/call` and
gets its `serverInfo` stamp, and a handler's error is mapped by the SDK's `modern_error_data`: the answer
is the SDK's answer (tests/test_mcp_plain.py holds the two paths to the same JSON).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
import structlog
from mcp.server._streamable_http_modern import _SingleExchangeDispatchContext  # the SDK's own, for one exchange
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.runner import modern_error_data
from mcp.server.session import ServerSession
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_PARAM_HEADER_PREFIX,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import methods as wire_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from worker.gateway.identity.security import BODY_SCOPE_KEY, send_json
from worker.gateway.mcp.back_channel import BackChannelTransport

log = structlog.get_logger("toolworker.gateway.mcp")
Context = ServerRequestContext[Any, Any]
Params = types.CallToolRequestParams
CallHandler = Callable[[Context, types.CallToolRequestParams], Awaitable[dict[str, Any]]]

_METHOD = "tools/call"
_PARAM_HEADER = MCP_PARAM_HEADER_PREFIX.lower()
_ENVELOPE_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_IDENTITIES_KEPT = 256  # distinct client envelopes kept; all forgotten when full
_IDENTITY_KEY_MAX = 4096  # characters of an envelope's repr: a larger one is not kept


class PlainCalls:
    """Answers the plain `tools/call` of a 2026-07-28 client (True), or leaves the request alone (False)."""

    def __init__(self, server: Server[Any], call_tool: CallHandler, transport: BackChannelTransport) -> None:
        self._server = server
        self._call_tool = call_tool
        self._transport = transport  # the JSON transport the request would go to: its settings and lifespan
        self._security = TransportSecurityMiddleware(transport.security_settings)
        self._identities: dict[str, Connection] = {}  # by envelope: connections whose identity new ones share

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bool:
        request = Request(scope, receive)
        found = await self._plain(request)
        if found is None:
            return False
        message, route, params = found
        connection = self._connection(route)
        exchange = _SingleExchangeDispatchContext(
            transport=TransportContext(kind="streamable-http", can_send_request=False, headers=request.headers),
            request_id=message["id"],
            message_metadata=ServerMessageMetadata(request_context=request),
        )
        ctx: Context = ServerRequestContext(
            session=ServerSession(exchange, connection, request_meta=params.meta),
            lifespan_context=self._transport.lifespan_state,
            method=_METHOD,
            params=message["params"],
            request_id=message["id"],
            meta=params.meta,
            protocol_version=route.protocol_version,
            request=request,
        )
        try:
            answer = {"result": self._wire(route.protocol_version, await self._call_tool(ctx, params))}
            status = 200
        except Exception as exc:  # the SDK's mapping: an MCPError as it says, anything else an internal error
            error = modern_error_data(exc)
            answer = {"error": error.model_dump(mode="json", by_alias=True, exclude_none=True)}
            status = ERROR_CODE_HTTP_STATUS.get(error.code, 200)
        finally:
            # What the SDK's runner does after a request (aclose_shielded), without its shielded, bounded scope:
            # nothing on this path puts a cleanup on the connection's exit stack, so there is none to protect.
            await connection.exit_stack.aclose()
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], **answer}, separators=(",", ":"))
        await send_json(send, status, body.encode())
        return True

    async def _plain(self, request: Request) -> tuple[dict[str, Any], InboundModernRoute, Params] | None:
        """The request's message, its route and its typed params, when it is the plain shape and passes
        every check the SDK makes of one; None otherwise (the SDK answers it)."""
        if request.method != "POST":
            return None
        pairs = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.raw]
        headers = dict(reversed(pairs))  # by lower-case name (ASGI's), the first of a repeated one as Starlette reads
        if "mcp-session-id" in headers or headers.get("mcp-protocol-version") not in MODERN_PROTOCOL_VERSIONS:
            return None
        if not check_accept_headers(request)[0] or await self._security.validate_request(request, is_post=True):
            return None
        if find_duplicated_routing_header(pairs) or any(name.startswith(_PARAM_HEADER) for name in headers):
            return None  # parameters mirrored into headers: the SDK checks them against the tool's schema
        try:
            message = json.loads(request.scope.get(BODY_SCOPE_KEY, b""))
        except (ValueError, RecursionError):
            return None
        if not _plain_envelope(message):
            return None
        route = classify_inbound_request(message, headers=headers)
        if not isinstance(route, InboundModernRoute):
            return None
        try:
            wire_methods.validate_client_request(_METHOD, route.protocol_version, message["params"])
            params = types.CallToolRequestParams.model_validate(message["params"], by_name=False)
        except Exception:  # what is wrong with them is the SDK's to say
            return None
        return message, route, params

    def _connection(self, route: InboundModernRoute) -> Connection:
        """The request's connection, as `Connection.from_envelope` makes it, its typed client identity (two or three
        pydantic models, most of what a connection costs) made once per envelope: a client sends the same
        `clientInfo` and capabilities with every request."""
        key = _envelope_key(route)
        if key is None:  # an outsized or too deep envelope is typed each time, not kept
            return Connection.from_envelope(route.protocol_version, route.client_info, route.client_capabilities)
        template = self._identities.get(key)
        if template is None:
            if len(self._identities) >= _IDENTITIES_KEPT:
                self._identities.clear()
            template = Connection.from_envelope(route.protocol_version, route.client_info, route.client_capabilities)
            self._identities[key] = template
        connection = Connection(template.outbound, protocol_version=route.protocol_version)
        connection.client_params = template.client_params
        connection.client_capabilities = template.client_capabilities
        connection.initialized.set()
        return connection

    def _wire(self, version: str, result: dict[str, Any]) -> dict[str, Any]:
        """The result as the SDK's runner shapes a `tools/call` result: the revision's surface (which
        requires `resultType`; a claimed extension shape is left as it is), and the server's identity in
        `_meta` unless the handler put one there."""
        result_type = result.get("resultType")
        if not isinstance(result_type, str) or result_type in types.CORE_RESULT_TYPES:
            try:
                result = wire_methods.serialize_server_result(_METHOD, version, result)
            except ValidationError:  # as the SDK says it: a server bug, its detail in the log only
                log.exception("gateway.invalid_tools_call_result")
                raise MCPError(code=types.INTERNAL_ERROR, message="Handler returned an invalid result") from None
        else:
            result = dict(result)
        meta = result.get("_meta")
        if meta is None:
            result["_meta"] = {types.SERVER_INFO_META_KEY: self._server.server_info_stamp}
        elif isinstance(meta, dict) and meta.get(types.SERVER_INFO_META_KEY) is None:
            result["_meta"] = {**meta, types.SERVER_INFO_META_KEY: self._server.server_info_stamp}
        return result


def _envelope_key(route: InboundModernRoute) -> str | None:
    """What identifies a client's envelope (its values as parsed from JSON, written out), or None when it is too
    large to keep or too deep to write out."""
    try:
        key = repr((route.protocol_version, route.client_info, route.client_capabilities))
    except RecursionError:
        return None
    return key if len(key) <= _IDENTITY_KEY_MAX else None


def _plain_envelope(message: Any) -> bool:
    """One JSON-RPC `tools/call` request and nothing more (a batch, a notification or an odd id: the SDK's)."""
    if not isinstance(message, dict) or message.keys() != _ENVELOPE_KEYS:
        return False
    request_id = message["id"]
    return (
        message["jsonrpc"] == "2.0"
        and message["method"] == _METHOD
        and isinstance(message["params"], dict)
        and (isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)))
    )
