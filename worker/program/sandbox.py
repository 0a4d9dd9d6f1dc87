"""The sandbox bridge: a program run in `pydantic-monty`, driven one stretch at a time.

A stretch starts a program (or resumes its stored state with its tool calls' answers) and runs it until
every task of the program waits for a tool call (`Suspended`: the state to store, the calls to send) or
until it ends (`Finished`: its value). Nothing else reaches the host: an import outside the allow-list, a
file, the environment or the network ends in the program's own error. Monty's errors are translated into
`ProgramFailed` here, and nowhere else.

Inside the program, `tools` has one method per tool the caller may use, and `ToolError` is raised by a
call whose exit code is not 0. Monty 1.4 has no class inheritance and exceptions carry one string, so
`ToolError` is the sandbox's `RuntimeError`, its text "<tool> exit <code>[ (HTTP <status>)]: <message>".
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_monty import (
    AsyncFunctionSnapshot,
    AsyncFutureSnapshot,
    AsyncMonty,
    AsyncNameLookupSnapshot,
    AsyncSnapshot,
    ExternalReturnValue,
    ExternalSettledResult,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
    ResourceLimits,
)

from worker import errors
from worker.definitions.signatures import python_name

ALLOWED_MODULES = frozenset({"json", "re", "math", "datetime", "asyncio"})
SCRIPT_NAME = "program.py"
HOST_CALL = "_toolworker_call"  # the one host function a program reaches, through `tools`
TOOL_ERROR_MARK = "ToolError: "  # how an uncaught ToolError's text begins
_PRELUDE_HEAD = f"""
ToolError = RuntimeError


async def _toolworker_tool(name, arguments):
    answer = await {HOST_CALL}(name, arguments)
    if answer['exitCode'] != 0:
        raise ToolError(answer['error'])
    return answer['value']


class _ToolworkerTools:
    pass
"""


@dataclass(frozen=True)
class Limits:
    """What one program may use (each a TOOLWORKER_CODE_* setting)."""

    max_calls: int = 50
    max_memory_mb: int = 64
    cpu_s: float = 5.0
    max_output_bytes: int = 1024 * 1024

    def monty(self) -> ResourceLimits:
        # The pool's suspension budget is a backstop only: the calls are counted by the run.
        return {
            "max_memory": self.max_memory_mb * 1024 * 1024,
            "max_turn_duration_secs": self.cpu_s,
            "max_suspensions": 4 * self.max_calls + 100,
        }


class ProgramFailed(errors.ToolError):
    """A program that ended in an error: its own, a limit, or a tool call it did not catch."""

    def __init__(self, error: errors.ToolError, line: int | None = None) -> None:
        where = f" (line {line})" if line else ""
        super().__init__(error.message + where)
        self.exit_code, self.type = error.exit_code, error.type  # type: ignore[misc]  # per instance: any family
        self.line = line


class LimitReached(errors.DeadlineExceeded):
    """A program past one of its limits (75); the message names the setting."""

    type = "program_limit"


class OutputTooLarge(errors.ResponseTooLarge):
    """A program's printed output or answer past TOOLWORKER_CODE_MAX_OUTPUT_BYTES (63)."""

    type = "program_output_too_large"


@dataclass(frozen=True)
class ToolRequest:
    """One tool call the program made: Monty's id for it, the tool, its arguments."""

    monty_id: int
    tool: str
    arguments: dict[str, Any]


@dataclass
class Suspended:
    """Every task of the program waits: the state to store, and the calls it made in this stretch."""

    state: bytes
    requests: list[ToolRequest]
    pending: list[int]
    output: str


@dataclass
class Finished:
    """The program's value (JSON-ready) and what it printed in this stretch."""

    value: Any
    output: str


@dataclass
class _Printed:
    """A program's printed text, refused past its cap."""

    max_bytes: int
    parts: list[str] = field(default_factory=list)
    size: int = 0
    overflowed: bool = False

    def __call__(self, stream: str, text: str) -> None:
        self.size += len(text.encode())
        if self.size > self.max_bytes:
            self.overflowed = True
            return
        self.parts.append(text)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def prelude(tools: Iterable[str]) -> str:
    """The code run before a program: `ToolError`, and `tools` with a method per tool."""
    lines = [_PRELUDE_HEAD]
    for tool in sorted(set(tools)):
        lines.append(f"    async def {python_name(tool)}(self, **arguments):")
        lines.append(f"        return await _toolworker_tool({json.dumps(tool)}, arguments)")
    lines.append("\n\ntools = _ToolworkerTools()\n")
    return "\n".join(lines)


def check_source(code: str) -> None:
    """Refuse (65) a program that does not parse, or that imports a module outside the allow-list."""
    try:
        tree = compile(code, SCRIPT_NAME, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        raise ProgramFailed(errors.InvalidArguments(f"The program does not parse: {exc.msg}."), exc.lineno) from None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = [node.module or "."] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        for name in names:
            if name.split(".")[0] not in ALLOWED_MODULES:
                allowed = ", ".join(sorted(ALLOWED_MODULES))
                error = errors.InvalidArguments(f"A program may import only {allowed}; not {name!r}.")
                raise ProgramFailed(error, node.lineno)


class Sandbox:
    """The Monty pool of a worker process; each stretch checks out a fresh session."""

    def __init__(self, limits: Limits, processes: int = 2) -> None:
        self.limits = limits
        # A hung sandbox is killed after its CPU budget and a grace; the pool replaces it.
        self._pool = AsyncMonty(min_processes=1, max_processes=processes, request_timeout=limits.cpu_s * 2 + 10)
        self._open = False

    async def _ready(self) -> AsyncMonty:
        if not self._open:
            await self._pool.__aenter__()
            self._open = True
        return self._pool

    async def close(self) -> None:
        if self._open:
            self._open = False
            await self._pool.__aexit__(None, None, None)

    async def start(self, code: str, tools: Iterable[str]) -> Suspended | Finished:
        """Run a new program until it suspends or ends."""
        check_source(code)
        pool, printed = await self._ready(), _Printed(self.limits.max_output_bytes)
        try:
            async with pool.checkout(limits=self.limits.monty(), script_name=SCRIPT_NAME) as session:
                await session.feed_run(prelude(tools))
                snapshot = await session.feed_start(code, print_callback=printed)
                return await self._stretch(snapshot, printed)
        except MontyError as exc:
            raise _translated(exc, self.limits, code) from None

    async def resume(self, state: bytes, answers: Mapping[int, Any], code: str = "") -> Suspended | Finished:
        """Load a stored state and resume it with the answers of the calls it waits for."""
        pool, printed = await self._ready(), _Printed(self.limits.max_output_bytes)
        settled: dict[int, ExternalSettledResult] = {
            monty_id: ExternalReturnValue(return_value=answer) for monty_id, answer in answers.items()
        }
        try:
            async with pool.checkout(limits=self.limits.monty(), script_name=SCRIPT_NAME) as session:
                snapshot = await session.load_snapshot(state, print_callback=printed)
                if not isinstance(snapshot, AsyncFutureSnapshot):
                    raise ProgramFailed(errors.InternalError("The program's stored state is not a suspension."))
                return await self._stretch(await snapshot.resume(settled), printed)
        except MontyError as exc:
            raise _translated(exc, self.limits, code) from None

    async def _stretch(self, snapshot: AsyncSnapshot, printed: _Printed) -> Suspended | Finished:
        """Answer what the sandbox asks until every task waits on a tool call, or the program ends."""
        requests: list[ToolRequest] = []
        while not isinstance(snapshot, MontyComplete):
            _check_output(printed, self.limits)
            if isinstance(snapshot, AsyncFunctionSnapshot):
                snapshot = await self._answered(snapshot, requests)
            elif isinstance(snapshot, AsyncNameLookupSnapshot):
                snapshot = await snapshot.resume()  # an undefined name: NameError in the program
            else:
                return Suspended(snapshot.dump(), requests, list(snapshot.pending_call_ids), printed.text)
        _check_output(printed, self.limits)
        return Finished(_plain(snapshot.output, self.limits), printed.text)

    async def _answered(self, snapshot: AsyncFunctionSnapshot, requests: list[ToolRequest]) -> AsyncSnapshot:
        """A tool call becomes a pending future; anything else the sandbox asks the host is refused."""
        if snapshot.is_os_function:
            return await snapshot.resume_not_handled()
        if snapshot.function_name != HOST_CALL or len(snapshot.args) != 2:
            message = f"name {snapshot.function_name!r} is not defined"
            return await snapshot.resume({"exc_type": "NameError", "message": message})
        tool, arguments = snapshot.args
        requests.append(ToolRequest(snapshot.call_id, str(tool), dict(arguments)))
        return await snapshot.resume({"future": ...})


def _check_output(printed: _Printed, limits: Limits) -> None:
    if printed.overflowed:
        text = f"The program printed more than TOOLWORKER_CODE_MAX_OUTPUT_BYTES ({limits.max_output_bytes} bytes)."
        raise ProgramFailed(OutputTooLarge(text))


def _plain(value: Any, limits: Limits) -> Any:
    """The program's value as JSON can carry it (anything else as its repr), within the output cap."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        value = repr(value)
        text = json.dumps(value, ensure_ascii=False)
    if len(text.encode()) > limits.max_output_bytes:
        size = f"{len(text.encode())} bytes"
        message = f"The program's value ({size}) is over TOOLWORKER_CODE_MAX_OUTPUT_BYTES ({limits.max_output_bytes})."
        raise ProgramFailed(OutputTooLarge(message))
    return value


def _translated(exc: MontyError, limits: Limits, code: str) -> ProgramFailed:
    """Monty's error as the program's failure: what the program did wrong (65, 70), a limit (75), or a
    tool call that failed and was not caught (the call's own exit code)."""
    if isinstance(exc, MontyCrashedError):
        text = f"The sandbox running the program was lost ({exc}); it used more than its limits allow."
        return ProgramFailed(LimitReached(text))
    if isinstance(exc, MontySyntaxError):
        text = f"The program does not parse: {exc.display('msg')}."
        return ProgramFailed(errors.InvalidArguments(text), _line(exc, code))
    if not isinstance(exc, MontyRuntimeError):
        return ProgramFailed(errors.InternalError(f"The sandbox refused the program: {exc}."))
    kind, _, message = exc.display("type-msg").partition(": ")
    line = _line(exc, code)
    limit = _limit_of(kind, message, limits)
    if limit is not None:
        return ProgramFailed(LimitReached(limit), line)
    if kind == "RuntimeError" and message.startswith(TOOL_ERROR_MARK):
        return ProgramFailed(_tool_failure(message[len(TOOL_ERROR_MARK) :]), line)
    return ProgramFailed(ProgramError(f"{kind}: {message}"), line)


def _limit_of(kind: str, message: str, limits: Limits) -> str | None:
    """The text naming the setting a limit error comes from; None for any other error."""
    if kind == "MemoryError":
        return f"The program used more memory than TOOLWORKER_CODE_MAX_MEMORY_MB ({limits.max_memory_mb} MB)."
    if kind == "TimeoutError" and "time limit" in message:
        return f"The program ran longer than TOOLWORKER_CODE_CPU_SECONDS ({limits.cpu_s} s) without a tool call."
    if kind == "RecursionError":
        return "The program's recursion went deeper than the sandbox allows (1000 calls)."
    if kind == "RuntimeError" and "suspension" in message:
        return f"The program made more than TOOLWORKER_CODE_MAX_CALLS ({limits.max_calls}) tool calls."
    return None


class ProgramError(errors.InvalidArguments):
    """An exception the program raised and did not catch (65: the program is the input at fault)."""

    type = "program_error"


class ToolCallFailed(errors.ToolError):
    """A tool call of the program failed and the program did not catch its ToolError."""

    type = "tool_error"


def _tool_failure(text: str) -> errors.ToolError:
    """The uncaught ToolError as the program's error, with the exit code of the call that raised it."""
    error = ToolCallFailed(f"A tool call failed and the program did not catch it: {text}")
    match = re.search(r" exit (\d+)", text)
    error.exit_code = int(match.group(1)) if match else 70  # type: ignore[misc]  # the child's own family
    return error


def _line(exc: MontySyntaxError | MontyRuntimeError, code: str) -> int | None:
    """The line of the program where it failed: the innermost frame whose text is the program's (the
    prelude's frames carry the same script name)."""
    lines = code.splitlines()
    for frame in reversed(exc.traceback()):
        text = frame.source_line
        if 0 < frame.line <= len(lines) and (text is None or text.strip() == lines[frame.line - 1].strip()):
            return frame.line
    return None
