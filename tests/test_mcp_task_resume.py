"""A 2025-11-25 server's task outlives the worker that polls it: server-everything binds each task to the session
that created it (its task store refuses another session's `tasks/get`), so the task's record keeps that session,
and the worker given the call again polls the task on it. kill -9 of the polling worker: the other one answers
from the same task, which it never starts again. Real server (npm), real workers, a Redis of the test's own."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import start_worker, stop_worker, wait_ready
from tests.support.mcp_servers import EVERYTHING, McpServerProcess, McpStack, everything, mcp_stack
from tests.support.waiting import wait_until
from worker.client import ToolClient
from worker.mcp_client import task_records

TOOL = "everything_simulate-research-query"  # four stages of a second each, run as a task


@pytest.fixture(scope="module")
def server() -> Iterator[McpServerProcess]:
    if not EVERYTHING.exists():
        pytest.fail("server-everything is not installed: run `make test` (the Makefile's MCP_EVERYTHING rule)")
    started = everything().start()
    yield started
    started.kill()


@pytest.fixture(scope="module")
def stack(server: McpServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpStack]:
    folder = tmp_path_factory.mktemp("resume-defs")
    (folder / "mcp.yaml").write_text(
        f"upstreams:\n  everything: {{mcp: {{url: '{server.url}', include: ['simulate-*']}}, timeout_seconds: 20}}\n"
    )
    # A call whose worker is lost goes back to the queue once its lease (2 s) lapses.
    started = mcp_stack(folder, tmp_path_factory, ["everything"], TOOLWORKER_LEASE_SECONDS="2")
    yield started
    started.redis.stop()


def _worker(stack: McpStack, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = stack.log_path.with_name(f"{name}.log")
    process = start_worker(stack.env, log)
    wait_ready(process, log)
    return process, log


def _said(log: Path, event: str, call_id: str) -> bool:
    return any(event in line and call_id in line for line in log.read_text(errors="replace").splitlines())


@pytest.mark.integration
def test_a_worker_killed_while_it_polls_a_2025_11_25_task_is_replaced_on_its_session(stack: McpStack) -> None:
    workers = dict(one=_worker(stack, "one"), two=_worker(stack, "two"))
    try:
        with ToolClient(stack.redis.url) as client, redis.Redis.from_url(stack.redis.url) as store:
            handle = client.submit(TOOL, {"topic": "tides"}, timeout=90)
            key = task_records.key_of(handle.call_id)
            wait_until(lambda: store.hget(key, "task") is not None, 30, "the upstream task recorded")
            assert store.hget(key, "session"), store.hgetall(key)  # the session the task is bound to
            started = lambda name: _said(workers[name][1], "mcp.task_started", handle.call_id)  # noqa: E731
            wait_until(lambda: any(started(name) for name in workers), 30, "a worker's log line of the task")
            polling = next(name for name in workers if started(name))
            workers[polling][0].send_signal(signal.SIGKILL)
            workers[polling][0].wait(10)
            answer = handle.get(timeout=90)
        survivor = next(name for name in workers if name != polling)
        assert answer.exit_code == 0 and "# Research Report: tides" in (answer.result or ""), answer.to_dict()
        log = workers[survivor][1]
        assert _said(log, "mcp.task_resumed", handle.call_id), log.read_text()[-3000:]
        assert not _said(log, "mcp.task_started", handle.call_id)  # the tool was not called again
    finally:
        for process, _ in workers.values():
            if process.poll() is None:
                stop_worker(process)
