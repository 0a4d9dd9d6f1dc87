"""What an MCP server sends during one of our calls, handed to the caller when it listens (worker/call/relay.py
carries it through Redis to the gateway holding the caller's stream), declined when it cannot answer.

    notifications/progress   of the call's own request (its progressToken): to the caller that asked for progress
    notifications/message    log messages, at or above the caller's level (`logging/setLevel` on the session)
    elicitation/create       form or URL mode, to a caller that declared that mode; else declined, and noted
    sampling/createMessage   to a caller that declared sampling; else refused, and noted

The sessions declare elicitation (both modes) and sampling. A 2026-07-28 server asks within the call (an
`input_required` answer, a task waiting for input): those questions are the call's own (`answer_inputs`). Before
that revision, a call whose caller listens for log messages or can answer requests gets a session of its own
for its time (the level is the session's, and a server's request names no call); the others share the
server's session, whose requests go to the call in flight when there is exactly one (else they are declined
unnoted: whose they are cannot be told). On 2026-07-28 only a caller's log level takes a session of its own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import structlog
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_REQUEST,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequest,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    ErrorData,
    LoggingMessageNotificationParams,
)
from mcp_types import InputRequest
from pydantic import BaseModel, TypeAdapter, ValidationError

from worker.protocol import Relay

log = structlog.get_logger("toolworker.mcp")
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
ELICITATION = "elicitation/create"
SAMPLING = "sampling/createMessage"
ResultT = TypeVar("ResultT", bound=BaseModel)
_INPUT_REQUEST: TypeAdapter[InputRequest] = TypeAdapter(InputRequest)
RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"


class Listener(Protocol):
    """Where a call's upstream messages go (the caller's stream, through Redis)."""

    async def progress(self, progress: float, total: float | None, message: str | None) -> None: ...

    async def log(self, params: Mapping[str, Any]) -> None: ...

    async def ask(self, method: str, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The caller's answer as it gave it, `{"result": ...}` or `{"error": {code, message}}`; None when it
        gave none within the call's deadline."""
        ...


class CallRelay:
    """One call's side of what its server sends: to `listener` what `wants` says the caller listens for, the
    rest declined; what was declined is told in the call's note (`notes`), a URL the caller should have been
    sent to kept (`visit_url`)."""

    def __init__(self, listener: Listener | None = None, wants: Relay | None = None) -> None:
        self.listener = listener
        self.wants = wants or Relay()
        self.notes: list[str] = []
        self.visit_url: str | None = None
        # Notifications are written in the order they came, by one writer, never holding up the session's
        # reading; `flush` waits for them (the result is published after them).
        self._unwritten: deque[Callable[[], Awaitable[None]]] = deque()
        self._writer: asyncio.Task[None] | None = None

    @property
    def own_session(self) -> bool:
        """Whether the call needs a session of its own: its caller listens for more than its progress (on a
        2026-07-28 server, only its log messages need one: sessions.py)."""
        wants = self.wants
        return self.listener is not None and bool(wants.log_level or wants.elicitation or wants.sampling)

    @property
    def progress_callback(self) -> Any:
        return self.on_progress if self.listener is not None and self.wants.progress else None

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        listener = self.listener
        if listener is not None:
            self._write(lambda: listener.progress(progress, total, message))

    async def on_log(self, params: LoggingMessageNotificationParams) -> None:
        listener, level = self.listener, self.wants.log_level
        if listener is None or level is None or LEVELS.index(params.level) < LEVELS.index(level):
            return
        dumped = params.model_dump(mode="json", by_alias=True, exclude_none=True)
        self._write(lambda: listener.log(dumped))

    def _write(self, write: Callable[[], Awaitable[None]]) -> None:
        self._unwritten.append(write)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._writing())

    async def _writing(self) -> None:
        while self._unwritten:
            try:
                await self._unwritten.popleft()()
            except Exception as exc:  # a notification lost: the call goes on
                log.warning("mcp.relay_write_failed", error=str(exc))

    async def flush(self) -> None:
        """Wait until the notifications received so far are written."""
        if self._writer is not None:
            await asyncio.shield(self._writer)

    async def on_elicit(
        self, context: ClientRequestContext | None, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        mode = "url" if isinstance(params, ElicitRequestURLParams) else "form"
        if self.listener is not None and mode in self.wants.elicitation:
            answer = await self.listener.ask(ELICITATION, _dumped(params))
            if answer is None:
                self.notes.append(f"The MCP server asked for input ({params.message!r}); no answer came in time.")
                return ElicitResult(action="cancel")
            return _answer(answer, ElicitResult)
        if isinstance(params, ElicitRequestURLParams):
            self.visit_url = params.url
            self.notes.append(
                f"The MCP server asked that a page be visited ({params.message!r}: {params.url}); this caller "
                "cannot be asked during a call, so the request was declined."
            )
        else:
            self.notes.append(
                f"The MCP server asked for input ({params.message!r}); this caller cannot be asked during a "
                "call, so the request was declined."
            )
        return ElicitResult(action="decline")

    async def on_sample(
        self, context: ClientRequestContext | None, params: CreateMessageRequestParams
    ) -> CreateMessageResult | CreateMessageResultWithTools | ErrorData:
        if self.listener is not None and self.wants.sampling:
            answer = await self.listener.ask(SAMPLING, _dumped(params))
            if answer is None:
                self.notes.append("The MCP server asked for a model's completion (sampling); none came in time.")
                return ErrorData(code=INVALID_REQUEST, message="The caller gave no completion in time.")
            with_tools = isinstance((answer.get("result") or {}).get("content"), list)
            return _answer(answer, CreateMessageResultWithTools if with_tools else CreateMessageResult)
        self.notes.append(
            "The MCP server asked for a model's completion (sampling); this caller cannot be asked during a call, "
            "so the request was refused."
        )
        return ErrorData(code=INVALID_REQUEST, message="The caller of this call cannot answer sampling requests.")

    async def answer_inputs(self, requests: Mapping[str, Any]) -> dict[str, Any]:
        """A 2026-07-28 server's input requests of this call (an `input_required` result, or a task waiting for
        input), keyed as the server keyed them: each asked of the caller where it listens, else declined, as on
        a session. Raises MCPError when one cannot be answered (a refused sampling, roots), as the SDK's own
        driver does: the call ends with it."""
        answers: dict[str, Any] = {}
        for key, raw in requests.items():
            request = raw if isinstance(raw, BaseModel) else _INPUT_REQUEST.validate_python(raw, by_name=False)
            if isinstance(request, ElicitRequest):
                answer: BaseModel = await self.on_elicit(None, request.params)
            elif isinstance(request, CreateMessageRequest):
                answer = await self.on_sample(None, request.params)
            else:
                method = getattr(request, "method", "this request")
                answer = ErrorData(code=INVALID_REQUEST, message=f"{method} is not answered for MCP servers.")
            if isinstance(answer, ErrorData):
                raise MCPError.from_error_data(answer)
            answers[key] = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
        return answers

    def callbacks(self) -> dict[str, Any]:
        """The SDK `Client`'s callbacks of a session of this call's own."""
        return {
            "elicitation_callback": self.on_elicit,
            "sampling_callback": self.on_sample,
            "logging_callback": self.on_log,
            "log_level": self.wants.log_level,  # the 2026-07-28 opt-in, on each request
        }


class InFlight:
    """The calls under way on a shared session: a server's request that names a task (2025-11-25: its
    related-task `_meta`) goes to the call waiting on that task; another to the only call, if one."""

    def __init__(self) -> None:
        self.calls: list[CallRelay] = []
        self.tasks: dict[str, CallRelay] = {}  # by the server's task id, while its result is asked for

    def _of(self, context: ClientRequestContext) -> CallRelay:
        related = (context.meta or {}).get(RELATED_TASK_META_KEY)
        task_id = related.get("taskId") if isinstance(related, Mapping) else None
        if isinstance(task_id, str) and task_id in self.tasks:
            return self.tasks[task_id]
        if len(self.calls) == 1:
            return self.calls[0]
        log.info("mcp.request_declined", reason="calls in flight", calls=len(self.calls))
        return CallRelay()  # declined, its note told to no call

    async def on_elicit(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        return await self._of(context).on_elicit(context, params)

    async def on_sample(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult | CreateMessageResultWithTools | ErrorData:
        return await self._of(context).on_sample(context, params)

    def callbacks(self) -> dict[str, Any]:
        return {"elicitation_callback": self.on_elicit, "sampling_callback": self.on_sample}


def _answer(answer: Mapping[str, Any], model: type[ResultT]) -> ResultT | ErrorData:
    """The caller's answer for the server: its result unchanged, or its error."""
    try:
        if "error" in answer:
            return ErrorData.model_validate(answer["error"])
        return model.model_validate(answer.get("result"))
    except ValidationError:
        return ErrorData(code=INVALID_REQUEST, message="The caller's answer was malformed.")


def _dumped(params: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = params.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped
