"""The errors a tool call can end with, one class per exit code of the result envelope.

    ToolError                    (exit_code, type; message written for the model)
    ├── RequestError             the call never left the worker
    │   ├── MalformedURL         3
    │   ├── UnknownTool          64
    │   ├── InvalidArguments     65
    │   ├── AuthorizationRequired 67 (the call's user has not connected the upstream: the message says where)
    │   ├── UpstreamUnavailable  69  (circuit open)
    │   ├── InternalError        70
    │   ├── DeadlineExceeded     75
    │   │   ├── TenantQueueFull  75  (the tenant's max_queued; also raised by the client at enqueue)
    │   │   └── ApprovalExpired  75  (nobody decided on a parked call in time; never sent)
    │   ├── EgressBlocked        77  (not permitted)
    │   │   ├── ApprovalDenied   77  (a principal with `approve` denied a parked call; never sent)
    │   │   └── CallbackRefused  77  (a callback URL TOOLWORKER_CALLBACK_ALLOW does not allow)
    │   └── ToolMisconfigured    78
    ├── ToolFailed               22  an MCP server's answer: a result with isError, or a JSON-RPC error
    └── TransportError           the request was attempted
        ├── HostNotFound         6
        ├── ConnectFailed        7
        ├── TimedOut             28
        ├── TLSFailed            35
        ├── TooManyRedirects     47
        ├── EmptyResponse        52
        ├── ReceiveFailed        56
        └── ResponseTooLarge     63

aiohttp's exceptions are translated into this tree in `http/transport.py` only; the tree is turned into
an envelope by `call/shaping.py` (`ToolResult.failure` for a call refused before it ran, or for what never
became a call) only. A non-2xx answer (exit 22) is a response, not an exception.

A client (Python or the CLI) waiting for a call raises one error of its own, not an envelope:

    RedisLost (ConnectionError, TimeoutError)   Redis did not answer within the call's timeout plus
                                                CLIENT_SLACK_S; the CLI exits 69
"""

from __future__ import annotations

from typing import ClassVar


class ToolError(Exception):
    exit_code: ClassVar[int] = 70
    type: ClassVar[str] = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RequestError(ToolError):
    """The call was refused before any request was sent."""


class TransportError(ToolError):
    """The request was attempted and failed on the way."""

    retryable: ClassVar[bool] = False


class ToolFailed(ToolError):
    """An MCP server answered that the call failed (worker/mcp_client/failures.py)."""

    exit_code = 22
    type = "tool_error"


class MalformedURL(RequestError):
    exit_code = 3
    type = "malformed_url"


class UnknownTool(RequestError):
    """No tool of this name is served (the worker's catalog, or what a gateway offers)."""

    exit_code = 64
    type = "unknown_tool"

    def __init__(self, name: str, advice: str = "") -> None:
        super().__init__(f"There is no tool named {name!r}." + (f" {advice}" if advice else ""))
        self.name = name


class InvalidArguments(RequestError):
    exit_code = 65
    type = "invalid_arguments"


class AuthorizationRequired(RequestError):
    """The call acts for a user who has not granted this upstream access (or whose grant was withdrawn):
    it was not sent; the message gives the connect URL when there is one (curl's 67, "login denied")."""

    exit_code = 67
    type = "authorization_required"


class UpstreamUnavailable(RequestError):
    exit_code = 69
    type = "upstream_unavailable"


class InternalError(RequestError):
    exit_code = 70
    type = "internal_error"


class DeadlineExceeded(RequestError):
    exit_code = 75
    type = "deadline_exceeded"


class TenantQueueFull(DeadlineExceeded):
    """A tenant has max_queued calls waiting: the call is refused, not queued (the client raises it at
    enqueue; a message pushed past the limit by hand is answered with it)."""

    type = "tenant_queue_full"

    def __init__(self, tenant: str, limit: int) -> None:
        super().__init__(
            f"The tenant {tenant!r} may have at most {limit} calls waiting (its max_queued) and has too many; "
            "this call was refused, not queued. Try again once some have been answered."
        )
        self.tenant = tenant
        self.limit = limit


class ApprovalExpired(DeadlineExceeded):
    """A call parked for a human's approval that nobody approved within TOOLWORKER_APPROVAL_TTL_SECONDS."""

    type = "approval_expired"


class EgressBlocked(RequestError):
    """Not permitted: the egress policy refused the request (EX_NOPERM), or a policy like it refused the call."""

    exit_code = 77
    type = "egress_blocked"


class ApprovalDenied(EgressBlocked):
    """A call parked for a human's approval that a principal with the `approve` grant denied (a policy said
    no, and asking again unchanged will not help)."""

    type = "approval_denied"


class CallbackRefused(EgressBlocked):
    """A callback URL TOOLWORKER_CALLBACK_ALLOW does not allow (or callbacks are off): refused at enqueue."""

    type = "callback_refused"


class ToolMisconfigured(RequestError):
    exit_code = 78
    type = "tool_misconfigured"


class HostNotFound(TransportError):
    exit_code = 6
    type = "host_not_found"
    retryable = True


class ConnectFailed(TransportError):
    exit_code = 7
    type = "connect_failed"
    retryable = True


class TimedOut(TransportError):
    exit_code = 28
    type = "timeout"
    retryable = True


class TLSFailed(TransportError):
    exit_code = 35
    type = "tls_error"


class TooManyRedirects(TransportError):
    exit_code = 47
    type = "too_many_redirects"


class EmptyResponse(TransportError):
    exit_code = 52
    type = "empty_response"
    retryable = True


class ReceiveFailed(TransportError):
    exit_code = 56
    type = "receive_failed"


class ResponseTooLarge(TransportError):
    exit_code = 63
    type = "response_too_large"


class RedisLost(ConnectionError, TimeoutError):
    """A client's call could not be enqueued or answered because Redis went away; the message names the
    server (password masked) and why. A TimeoutError too: the caller's wait ended at its timeout."""
