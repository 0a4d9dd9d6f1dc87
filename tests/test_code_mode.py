"""Code mode through real processes: a Redis-compatible server, two `toolworker worker` processes with the
real sandbox, a local upstream counting requests, the Python client and the command line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, start_worker, stop_worker, worker_env
from tests.support.servers import DnsServer, ServerThread, UpstreamState, make_upstream
from tests.support.waiting import wait_until
from worker.client import ToolClient
from worker.constants import PROGRAM_TOOL
from worker.dev.embedded import EmbeddedRedis
from worker.envelope import ToolResult

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
DEFINITIONS = FIXTURES / "code_mode"


@dataclass
class Fleet:
    redis: EmbeddedRedis
    upstream: UpstreamState
    env: dict[str, str]
    directory: Path
    workers: list[subprocess.Popen[bytes]]

    def run(self, code: str, timeout: float = 60, **arguments: object) -> ToolResult:
        with ToolClient(self.redis.url) as client:
            return client.call(PROGRAM_TOOL, {"code": code, **arguments}, timeout=timeout)

    def hits(self, prefix: str) -> int:
        return self.upstream.hits_to(prefix)


@pytest.fixture(scope="module")
def fleet(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A Redis of its own, two workers on tests/fixtures/code_mode (short leases: a killed one's program
    comes back quickly), and the counting upstream."""
    directory = tmp_path_factory.mktemp("code-mode")
    server = EmbeddedRedis(directory / "redis").start()
    state = UpstreamState()
    upstream = ServerThread(make_upstream(state)).start()
    env = worker_env(server.url, upstream.url, dns_server.address, DEFINITIONS)
    env.update(TOOLWORKER_LEASE_SECONDS="2", TOOLWORKER_CODE_CPU_SECONDS="4", TOOLWORKER_CODE_MAX_CALLS="40")
    workers = [start_worker(env, directory / f"worker-{i}.log") for i in range(2)]
    handle = Fleet(server, state, env, directory, workers)
    try:
        warm = handle.run("await tools.get_item(item='warm')")
        assert warm.exit_code == 0, warm.to_dict()
        yield handle
    finally:
        for worker in handle.workers:
            stop_worker(worker)
        upstream.stop()
        server.stop()


def tag() -> str:
    return uuid.uuid4().hex[:10]


def test_three_dependent_calls_and_a_gather_of_ten(fleet: Fleet) -> None:
    """Each call uses the previous answer; the gather sends ten at once; the value and the call lines say so."""
    t = tag()
    code = f"""
import asyncio
a = await tools.get_item(item="{t}-a")
b = await tools.get_item(item=a["path"].split("/")[-1] + "-b")
c = await tools.get_item(item=b["path"].split("/")[-1] + "-c")
many = await asyncio.gather(*[tools.get_item(item="{t}-g" + str(i)) for i in range(10)])
print("chain ends at", c["path"])
result = {{"chain": c["path"], "gathered": sorted(m["path"] for m in many)}}
result
"""
    answer = fleet.run(code)
    assert answer.exit_code == 0, answer.to_dict()
    assert answer.structured["chain"] == f"/echo/item/{t}-a-b-c"
    assert answer.structured["gathered"] == sorted(f"/echo/item/{t}-g{i}" for i in range(10))
    assert answer.output == f"chain ends at /echo/item/{t}-a-b-c\n"
    assert [line["exitCode"] for line in answer.calls or []] == [0] * 13
    assert [line["callId"] for line in answer.calls or []] == [f"{answer.call_id}~{i}" for i in range(13)]
    assert fleet.hits(f"/echo/item/{t}") == 13


def test_a_failed_call_is_a_tool_error_the_program_can_catch(fleet: Fleet) -> None:
    """A 404 raises ToolError inside the program; caught, the program goes on; uncaught, it ends 22."""
    caught = fleet.run("try:\n    await tools.missing_item()\nexcept ToolError as e:\n    r = str(e)\nr")
    assert caught.exit_code == 0 and "missing_item exit 22 (HTTP 404)" in caught.result
    uncaught = fleet.run("x = 1\nawait tools.missing_item()")
    assert (uncaught.exit_code, (uncaught.error or {}).get("type")) == (22, "tool_error")
    assert "(line 2)" in (uncaught.error or {}).get("message", "")


def test_grants_are_honoured_inside_the_program(fleet: Fleet) -> None:
    """A tool outside the call's list is no method of `tools`: the program fails and nothing is sent."""
    t = tag()
    answer = fleet.run(f"await tools.get_item(item='{t}')", tools=["slow_item"])
    assert answer.exit_code == 65 and "get_item" in (answer.error or {}).get("message", "")
    assert fleet.hits(f"/echo/item/{t}") == 0


@pytest.mark.parametrize(
    ("code", "exit_code", "named"),
    [
        ("while True:\n    pass", 75, "TOOLWORKER_CODE_CPU_SECONDS"),
        ('x = "a"\nwhile True:\n    x = x + x', 75, "TOOLWORKER_CODE_MAX_MEMORY_MB"),
        ("def f(n):\n    return f(n + 1)\nf(0)", 75, "recursion"),
        ("for i in range(10000):\n    await tools.get_item(item='flood')", 75, "TOOLWORKER_CODE_MAX_CALLS"),
        ('"x" * 5_000_000', 63, "TOOLWORKER_CODE_MAX_OUTPUT_BYTES"),
        ("x = 1\ny = (\n", 65, "(line 2)"),
    ],
)
def test_hostile_programs_end_with_a_clear_envelope(fleet: Fleet, code: str, exit_code: int, named: str) -> None:
    """Each hostile program is answered with its exit code and the limit it hit; the fleet keeps serving."""
    answer = fleet.run(code)
    assert answer.exit_code == exit_code, answer.to_dict()
    assert named in (answer.error or {}).get("message", "")
    assert fleet.run("1 + 1").result == "2"


def test_a_program_survives_its_worker_killed_mid_program(fleet: Fleet) -> None:
    """kill -9 of the worker running a stretch: the other resumes from the last state; each call reaches
    the upstream once and the value is right."""
    t = tag()
    code = f"""
a = await tools.get_item(item="{t}-first")
n = 0
for i in range(6_000_000):
    n = n + 1
b = await tools.get_item(item="{t}-second")
[a["path"], b["path"], n]
"""
    with ToolClient(fleet.redis.url) as client:
        handle = client.submit(PROGRAM_TOOL, {"code": code}, timeout=120)
        wait_until(lambda: fleet.hits(f"/echo/item/{t}-first") == 1, timeout_s=60)
        victim = _busy_worker(fleet.workers)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        answer = handle.get(timeout=120)
    fleet.workers[fleet.workers.index(victim)] = start_worker(fleet.env, fleet.directory / "worker-restarted.log")
    assert answer.exit_code == 0, answer.to_dict()
    assert answer.structured == [f"/echo/item/{t}-first", f"/echo/item/{t}-second", 6_000_000]
    assert fleet.hits(f"/echo/item/{t}-first") == 1
    assert fleet.hits(f"/echo/item/{t}-second") == 1


def _busy_worker(workers: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """The worker whose sandbox is running a program now: the one with a `monty` child using the CPU."""
    found: list[subprocess.Popen[bytes]] = []

    def busy() -> bool:
        # An idle sandbox gains no CPU; the running one gains some however loaded the machine is.
        before = {w.pid: _sandbox_ticks(w.pid) for w in workers}
        time.sleep(0.5)
        gained = {w.pid: _sandbox_ticks(w.pid) - before[w.pid] for w in workers}
        most = max(gained.values())
        leaders = [w for w in workers if gained[w.pid] == most]
        if most >= 2 and len(leaders) == 1:
            found.append(leaders[0])
        return bool(found)

    wait_until(busy, timeout_s=30, what="a sandbox running the program")
    return found[0]


def _sandbox_ticks(pid: int) -> int:
    """CPU ticks used so far by the sandbox processes under a worker."""
    return sum(_cpu_ticks(child) for child in _descendants(pid) if "monty" in _command(child))


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return children + [grand for child in children for grand in _descendants(child)]


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_child_parked_for_approval_parks_the_program(fleet: Fleet) -> None:
    """A call that needs approval waits for a human; approved, it runs once and the program ends."""
    t = tag()
    with ToolClient(fleet.redis.url) as client:
        handle = client.submit(PROGRAM_TOOL, {"code": f"r = await tools.delete_item(item='{t}')\nr['method']"})
        child = f"{handle.call_id}~0"
        wait_until(lambda: _parked(fleet, child), timeout_s=60)
        assert fleet.hits(f"/echo/delete/{t}") == 0
        decided = _toolworker(fleet, "approvals", "approve", child)
        assert decided.returncode == 0, decided.stderr
        answer = handle.get(timeout=60)
    assert (answer.exit_code, answer.result) == (0, "DELETE")
    assert fleet.hits(f"/echo/delete/{t}") == 1


def _parked(fleet: Fleet, call_id: str) -> bool:
    listing = _toolworker(fleet, "approvals", "list")
    return call_id in listing.stdout


def _toolworker(fleet: Fleet, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**fleet.env, "TOOLWORKER_REDIS_URL": fleet.redis.url}
    return subprocess.run([sys.executable, "-m", "worker", *argv], env=env, capture_output=True, text=True, timeout=60)


def test_run_code_from_the_command_line(fleet: Fleet, tmp_path: Path) -> None:
    """`toolworker run-code FILE` prints the envelope; its exit code is the program's."""
    program = tmp_path / "program.py"
    program.write_text("print('hello')\n(await tools.get_item(item='cli'))['path']\n")
    done = _toolworker(fleet, "run-code", str(program))
    assert done.returncode == 0, done.stderr
    assert "/echo/item/cli" in done.stdout and "hello" in done.stdout
    failed = subprocess.run(
        [sys.executable, "-m", "worker", "run-code", "-"],
        input="1 / 0\n",
        env={**fleet.env, "TOOLWORKER_REDIS_URL": fleet.redis.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 65, (failed.stdout, failed.stderr)


def test_a_program_without_tool_calls_is_answered_in_one_stretch(fleet: Fleet) -> None:
    """A program with no tool call is answered at once, with no call lines."""
    answer = fleet.run("import math\nmath.floor(2.5) + len([1, 2])")
    assert (answer.exit_code, answer.result, answer.calls) == (0, "4", [])
