"""The sandbox bridge with the real Monty sandbox: suspension, resumption, ToolError and hostile programs."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator

import pytest

from worker.definitions.signatures import python_name
from worker.program.sandbox import Finished, Limits, ProgramFailed, Sandbox, Suspended, prelude


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    box = Sandbox(Limits(max_calls=50, max_memory_mb=64, cpu_s=1.0, max_output_bytes=64 * 1024))
    yield box
    await box.close()


def _suspended(outcome: Suspended | Finished) -> Suspended:
    assert isinstance(outcome, Suspended), outcome
    return outcome


async def test_a_tool_call_suspends_and_the_answer_resumes_it(sandbox: Sandbox) -> None:
    """`await tools.x(...)` stops the program with one request; the answer is the call's value."""
    first = _suspended(
        await sandbox.start('print("start")\nt = await tools.ticket_lookup(id=7)\nt["n"] + 1', ["ticket_lookup"])
    )
    assert [(r.tool, r.arguments) for r in first.requests] == [("ticket_lookup", {"id": 7})]
    assert first.output == "start\n"
    done = await sandbox.resume(first.state, {first.pending[0]: {"exitCode": 0, "value": {"n": 41}}})
    assert done == Finished(42, "")


async def test_gather_makes_every_call_before_suspending(sandbox: Sandbox) -> None:
    """`asyncio.gather` of ten calls suspends once with ten requests (one flush)."""
    code = "import asyncio\nrs = await asyncio.gather(*[tools.echo(i=i) for i in range(10)])\nsum(rs)"
    first = _suspended(await sandbox.start(code, ["echo"]))
    assert sorted(r.arguments["i"] for r in first.requests) == list(range(10))
    answers = {r.monty_id: {"exitCode": 0, "value": r.arguments["i"]} for r in first.requests}
    assert await sandbox.resume(first.state, answers) == Finished(45, "")


async def test_a_tool_error_is_caught_by_the_program(sandbox: Sandbox) -> None:
    """A call that failed raises ToolError, which the program can catch."""
    code = "try:\n    await tools.t()\nexcept ToolError as e:\n    r = 'caught: ' + str(e)\nr"
    first = _suspended(await sandbox.start(code, ["t"]))
    answer = {"exitCode": 44, "error": "ToolError: t exit 44 (HTTP 404): gone"}
    done = await sandbox.resume(first.state, {first.pending[0]: answer})
    assert isinstance(done, Finished) and done.value == "caught: ToolError: t exit 44 (HTTP 404): gone"


async def test_an_uncaught_tool_error_ends_with_the_calls_exit_code(sandbox: Sandbox) -> None:
    """A failed call the program does not catch ends it with that call's exit code and its line."""
    code = "x = 1\nawait tools.t()"
    first = _suspended(await sandbox.start(code, ["t"]))
    answer = {"exitCode": 28, "error": "ToolError: t exit 28: slow"}
    with pytest.raises(ProgramFailed) as caught:
        await sandbox.resume(first.state, {first.pending[0]: answer}, code)
    assert (caught.value.exit_code, caught.value.type, caught.value.line) == (28, "tool_error", 2)


async def test_a_tool_outside_the_grant_does_not_exist(sandbox: Sandbox) -> None:
    """A tool the caller may not use is no method of `tools`: the program fails, nothing is sent."""
    with pytest.raises(ProgramFailed) as caught:
        await sandbox.start("await tools.secret_tool()", ["allowed"])
    assert caught.value.exit_code == 65 and "secret_tool" in caught.value.message


@pytest.mark.parametrize(
    ("code", "exit_code", "named"),
    [
        ("while True:\n    pass", 75, "TOOLWORKER_CODE_CPU_SECONDS"),
        ('x = "a"\nwhile True:\n    x = x + x', 75, "TOOLWORKER_CODE_MAX_MEMORY_MB"),
        ("def f(n):\n    return f(n + 1)\nf(0)", 75, "recursion"),
        ('"x" * 2_000_000', 63, "TOOLWORKER_CODE_MAX_OUTPUT_BYTES"),
        ("import asyncio\nawait asyncio.gather(*[tools.t() for i in range(10000)])", 75, "TOOLWORKER_CODE_MAX_CALLS"),
        ('for i in range(100000):\n    print("spam" * 10)', 63, "TOOLWORKER_CODE_MAX_OUTPUT_BYTES"),
        ("x = 1\ny = (\n", 65, "(line 2)"),
        ("import os\nos.environ", 65, "'os'"),
        ('open("/etc/passwd").read()', 65, "PermissionError"),
    ],
)
async def test_hostile_programs_end_with_a_clear_error(sandbox: Sandbox, code: str, exit_code: int, named: str) -> None:
    """Each hostile program ends with its exit code and a message naming what stopped it."""
    with pytest.raises(ProgramFailed) as caught:
        await sandbox.start(code, ["t"])
    assert caught.value.exit_code == exit_code
    assert named in caught.value.message
    assert await sandbox.start("1 + 1", []) == Finished(2, "")  # the sandbox keeps serving


def test_prelude_names_every_tool_as_a_python_method() -> None:
    """Tool names that are not identifiers become methods all the same; the prelude parses."""
    assert [python_name(n) for n in ["a.b-c", "9lives", "class"]] == ["a_b_c", "_9lives", "class_"]
    tree = ast.parse(prelude(["a.b-c", "ticket_lookup"]))
    methods = {node.name for node in ast.walk(tree) if isinstance(node, ast.AsyncFunctionDef)}
    assert {"a_b_c", "ticket_lookup"} <= methods
