"""Upstream tasks without processes: which calls run as tasks, how the server's refusal is read, and the poll
loop against a fake at the MCP client's seam (polls that fail on the way, a failed task's mapping)."""

from __future__ import annotations

import asyncio

from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from worker import errors
from worker.call.run import run_call
from worker.call.runtime import Runtime
from worker.definitions.mcp_tools import tool_of
from worker.definitions.model import McpServer, Source, ToolSet, Upstream
from worker.definitions.templates import Template
from worker.envelope import ToolResult
from worker.mcp_client.tasks import Created, TasksRequired, TaskState, tasks_required
from worker.protocol import ToolCall

TASK = {"taskId": "t1", "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z"}


def test_only_a_refusal_naming_the_tasks_extension_is_read_as_tasks_required() -> None:
    wanted = {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
    assert tasks_required(MCPError(-32021, "needs tasks", wanted))
    assert not tasks_required(MCPError(-32021, "needs something else", {"requiredCapabilities": {}}))
    assert not tasks_required(MCPError(-32602, "bad", wanted))


class TaskSessions:
    """The MCP client's seam: `tools/call` refused for want of tasks, then a task polled through `states`
    (an exception is a poll that failed on the way)."""

    def __init__(self, *states: TaskState | Exception) -> None:
        self.states = list(states)
        self.started = 0
        self.polls = 0

    async def call_tool(self, *_: object) -> CallToolResult:
        raise TasksRequired("the tool runs only as a task")

    async def start_task(self, *_: object) -> Created:
        self.started += 1
        return Created.model_validate({**TASK, "status": "working", "resultType": "task", "pollIntervalMs": 10})

    async def task_state(self, *_: object) -> TaskState:
        self.polls += 1
        state = self.states.pop(0)
        if isinstance(state, Exception):
            raise state
        return state

    async def close(self) -> None:
        return None


def state(status: str, **fields: object) -> TaskState:
    return TaskState.model_validate({**TASK, "status": status, "resultType": "complete", **fields})


def run_with(sessions: TaskSessions, task: str | None = None, tasks: bool = False) -> ToolResult:
    url = Template.literal("http://127.0.0.1:9/mcp")
    upstream = Upstream("s", url, mcp=McpServer(url, tasks=tasks))
    definition: dict[str, object] = {"name": "t"}
    if task is not None:
        definition["execution"] = {"taskSupport": task}
    tool = tool_of(upstream, "t", definition, Source("<test>"))
    runtime = Runtime(ToolSet({"s": upstream}, {tool.name: tool}), {}, mcp=sessions)  # type: ignore[arg-type]  # a fake at the client's seam
    return asyncio.run(run_call(ToolCall(call_id="c1", tool=tool.name, timeout_s=10), runtime))


def test_a_refused_call_is_sent_as_a_task_and_polled_through_failed_polls() -> None:
    """-32021 → the task; a poll lost on the way is tried again; the completed result is the answer."""
    done = {"content": [TextContent(type="text", text="ok").model_dump()], "isError": False}
    sessions = TaskSessions(
        errors.EmptyResponse("closed"), state("working", statusMessage="half"), state("completed", result=done)
    )
    answer = run_with(sessions)
    assert answer.exit_code == 0 and answer.result == "ok", answer.to_dict()
    assert sessions.started == 1 and sessions.polls == 3


def test_a_failed_task_maps_like_a_json_rpc_error() -> None:
    """A failed task's error: 22 with its message; invalid params (-32602): 65."""
    failed = TaskSessions(state("failed", error={"code": -32603, "message": "boom"}))
    answer = run_with(failed, task="required")
    assert answer.exit_code == 22 and "boom" in (answer.error or {}).get("message", ""), answer.to_dict()
    invalid = TaskSessions(state("failed", error={"code": -32602, "message": "bad input"}))
    assert run_with(invalid, task="required").exit_code == 65


def test_a_task_the_server_cancelled_is_22() -> None:
    answer = run_with(TaskSessions(state("cancelled")), tasks=True)
    assert answer.exit_code == 22 and "cancelled" in (answer.error or {}).get("message", ""), answer.to_dict()


def test_a_task_the_server_no_longer_knows_is_22_not_65() -> None:
    """tasks/get refused (an expired task: invalid params) is the task's failure, not the arguments'."""
    answer = run_with(TaskSessions(errors.InvalidArguments("Task t1 not found")), task="required")
    assert answer.exit_code == 22 and "t1 not found" in (answer.error or {}).get("message", ""), answer.to_dict()
