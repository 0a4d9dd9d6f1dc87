"""The SDK's failures as the exit-code tree (worker/errors.py), translated here only.

MCPError -32602 (invalid params)          InvalidArguments 65
MCPError -32001 (request timed out)       TimedOut 28
MCPError -32000 (connection closed)       EmptyResponse 52 (the request may have been received)
MCPError, other codes                     ToolFailed 22, its code and message in the text
httpx2 connect errors, OSError            ConnectFailed 7 (nothing was sent)
httpx2 timeouts, TimeoutError             TimedOut 28
other httpx2 transport errors             ReceiveFailed 56
"""

from __future__ import annotations

import httpx2
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, INVALID_PARAMS, INVALID_REQUEST, REQUEST_TIMEOUT, URL_ELICITATION_REQUIRED

from worker import errors

# How the SDK says that the server no longer knows the session (its 404): a new one is opened and the
# request, which the server refused unread, sent again.
SESSION_GONE_MESSAGE = "Session terminated"


class Unsent(Exception):
    """A request that provably never left: no session could be opened to send it on."""

    def __init__(self, error: errors.ToolError) -> None:
        super().__init__(error.message)
        self.error = error


def session_gone(exc: BaseException) -> bool:
    return isinstance(exc, MCPError) and exc.code == INVALID_REQUEST and exc.error.message == SESSION_GONE_MESSAGE


def connection_closed(exc: BaseException) -> bool:
    return isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED


def mapped(exc: BaseException, server: str) -> errors.ToolError:
    """The tool error a failure of a request to an MCP server ends a call with."""
    if isinstance(exc, errors.ToolError):
        return exc
    if isinstance(exc, MCPError):
        return _rpc_error(exc, server)
    for inner in _leaves(exc):
        if isinstance(inner, httpx2.ConnectError | ConnectionRefusedError):
            return errors.ConnectFailed(f"Could not connect to the MCP server {server!r}.")
        if isinstance(inner, httpx2.TimeoutException | TimeoutError):
            return errors.TimedOut(f"The MCP server {server!r} did not answer in time.")
        if isinstance(inner, httpx2.TransportError | OSError):
            return errors.ReceiveFailed(f"The connection to the MCP server {server!r} failed: {type(inner).__name__}.")
    return errors.ReceiveFailed(f"The MCP server {server!r} could not be reached: {type(exc).__name__}.")


def _rpc_error(exc: MCPError, server: str) -> errors.ToolError:
    message = f"The MCP server {server!r} answered error {exc.code}: {exc.error.message}"
    if exc.code == INVALID_PARAMS:
        return errors.InvalidArguments(message)
    if exc.code == REQUEST_TIMEOUT:
        return errors.TimedOut(f"The MCP server {server!r} did not answer in time.")
    if exc.code == CONNECTION_CLOSED:
        return errors.EmptyResponse(f"The connection to the MCP server {server!r} closed before it answered.")
    if exc.code == URL_ELICITATION_REQUIRED:  # the server's own page (its consent, a login) must be visited first
        pages = " ".join(_urls(exc.error.data))
        return errors.AuthorizationRequired(f"{message}. Visit first, then call again: {pages}".rstrip(": "))
    return errors.ToolFailed(message)


def _urls(data: object) -> list[str]:
    """The URLs of a -32042 error's elicitations."""
    found = data.get("elicitations") if isinstance(data, dict) else None
    items = found if isinstance(found, list) else []
    return [str(item["url"]) for item in items if isinstance(item, dict) and isinstance(item.get("url"), str)]


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exception, or the ones an exception group (an SDK task group's) holds, innermost first."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    return chain[::-1]
