"""Flower 2.2 against Celery 5.7: the worker and its calls show up in Flower's API, redacted, behind basic auth."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import WorkerProcess
from worker.client import ToolClient
from worker.constants import REDACTED, TASK_EXECUTE
from worker.dev.embedded import free_port

pytestmark = pytest.mark.integration

USER, PASSWORD = "user", "pass"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class FlowerProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def get(self, path: str, auth: tuple[str, str] | None = (USER, PASSWORD)) -> tuple[int, Any]:
        """GET a path on 127.0.0.1; the status and the JSON body (None when the body is not JSON)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with _NO_PROXY.open(request, timeout=10) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, _json(exc.read())

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _poll(probe: Callable[[], Any], timeout_s: float, interval_s: float = 0.25) -> Any:
    """Call `probe` until it returns something truthy or `timeout_s` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = probe()
        except OSError:  # not listening yet, or a connection reset while it starts
            answer = None
        if answer or time.monotonic() >= deadline:
            return answer
        time.sleep(interval_s)


def flower_env(redis_url: str) -> dict[str, str]:
    """The test environment without TOOLWORKER_* or FLOWER_* settings of the machine, on the test Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "FLOWER_"))}
    env["TOOLWORKER_REDIS_URL"] = redis_url
    return env


@pytest.fixture(scope="module")
def flower(worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerProcess]:
    """Flower on a free loopback port with basic auth, against the test Redis, once its event stream is live."""
    directory = tmp_path_factory.mktemp("flower")  # its working directory: no flowerconfig.py, no state file
    port = free_port()
    argv = [sys.executable, "-m", "celery", "-A", "worker.app", "flower"]
    argv += [f"--port={port}", "--address=127.0.0.1", f"--basic-auth={USER}:{PASSWORD}"]
    log_path = directory / "flower.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, env=flower_env(worker.redis_url), cwd=directory, stdout=log, stderr=log)
    handle = FlowerProcess(process, port, log_path)
    try:
        up = _poll(lambda: process.poll() is None and handle.get("/healthcheck", auth=None)[0] == 200, 30)
        assert up, handle.log_text()
        # Worker heartbeats arrive through Flower's event receiver: once one is seen, no call event is missed.
        alive = _poll(lambda: any(handle.get("/api/workers?status=1")[1] or {}), 30)
        assert alive, handle.log_text()
        yield handle
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for_tasks(flower: FlowerProcess, call_ids: list[str], timeout_s: float = 30) -> dict[str, Any]:
    """Flower's records of these calls, once every one has ended, SUCCESS or FAILURE (bounded)."""

    def done() -> dict[str, Any] | None:
        status, tasks = flower.get(f"/api/tasks?taskname={TASK_EXECUTE}")
        found = {cid: tasks[cid] for cid in call_ids if status == 200 and cid in tasks}
        ended = all(t["state"] in {"SUCCESS", "FAILURE"} for t in found.values())
        return found if len(found) == len(call_ids) and ended else None

    found = _poll(done, timeout_s)
    assert found, f"Flower did not show {call_ids} as ended; its log:\n{flower.log_text()}"
    return dict(found)


def test_calls_show_in_flower_redacted(flower: FlowerProcess, client: ToolClient) -> None:
    """Each call is a SUCCESS task with a runtime; its args show the call with header values redacted."""
    secret = f"secret-value-{uuid.uuid4().hex}"
    items = [f"flower-{i}" for i in range(3)]
    with_header = [client.call("echo_get", {"item": item}, headers={"X-User-Token": secret}) for item in items]
    plain = client.call("status", {"code": 404})
    assert [r.exit_code for r in with_header] == [0, 0, 0] and plain.exit_code == 22
    tasks = _wait_for_tasks(flower, [r.call_id for r in [*with_header, plain]])
    for item, result in zip(items, with_header, strict=True):
        task = tasks[result.call_id]
        assert task["name"] == TASK_EXECUTE
        assert task["runtime"] is not None and task["runtime"] > 0
        call = json.loads(task["args"])[0]
        assert call["callId"] == result.call_id and call["tool"] == "echo_get"
        assert call["arguments"] == {"item": item}
        assert call["headers"] == {"X-User-Token": REDACTED}
    assert json.loads(tasks[plain.call_id]["args"])[0]["arguments"] == {"code": 404}
    assert {tasks[r.call_id]["state"] for r in with_header} == {"SUCCESS"}
    status, everything = flower.get("/api/tasks")
    assert status == 200 and secret not in json.dumps(everything)
    status, one = flower.get(f"/api/task/info/{with_header[0].call_id}")
    assert status == 200 and one["state"] == "SUCCESS" and secret not in json.dumps(one)


def test_worker_that_ran_the_calls_is_listed(flower: FlowerProcess, client: ToolClient) -> None:
    """/api/workers lists the worker that ran a call, with its stats and the toolcalls queue."""
    result = client.call("echo_get", {"item": "which-worker"})
    name = _wait_for_tasks(flower, [result.call_id])[result.call_id]["worker"]
    assert name.startswith("test-")

    def listed() -> dict[str, Any] | None:
        status, workers = flower.get("/api/workers?refresh=1")
        return workers.get(name) if status == 200 and workers else None

    info = _poll(listed, 30, interval_s=1.0)
    assert info, flower.log_text()
    assert info["stats"]["pool"]["max-concurrency"] >= 1
    assert [q["name"] for q in info["active_queues"]] == ["toolcalls"]
    assert "toolcall.execute" in info["registered"]
    status, alive = flower.get("/api/workers?status=1")
    assert status == 200 and alive[name] is True


@pytest.mark.parametrize("path", ["/api/workers", "/api/tasks", "/api/task/info/00000000-0000-0000-0000-000000000000"])
@pytest.mark.parametrize("auth", [None, (USER, "wrong")], ids=["no-auth", "wrong-password"])
def test_api_needs_basic_auth(flower: FlowerProcess, path: str, auth: tuple[str, str] | None) -> None:
    """Without credentials, or with wrong ones, the API answers 401."""
    status, _ = flower.get(path, auth=auth)
    assert status == 401


def test_a_failed_call_is_failed_in_flower_and_a_stock_client_still_gets_its_envelope(
    flower: FlowerProcess, client: ToolClient, worker: WorkerProcess
) -> None:
    """A 404 call shows as FAILURE with its tool, error type and message; a 200 call as SUCCESS; Celery's own
    `AsyncResult.get()` returns both envelopes."""
    from celery import Celery

    failed, succeeded = client.call("status", {"code": 404}), client.call("echo_get", {"item": "fine"})
    tasks = _wait_for_tasks(flower, [failed.call_id, succeeded.call_id])
    assert tasks[succeeded.call_id]["state"] == "SUCCESS"
    assert tasks[failed.call_id]["state"] == "FAILURE"
    assert "CallFailed" in tasks[failed.call_id]["exception"]
    assert "status: exit 22 http_error" in tasks[failed.call_id]["exception"]
    stock = Celery("stock", broker=worker.redis_url, backend=worker.redis_url, set_as_current=False)
    try:
        envelopes = [stock.AsyncResult(r.call_id).get(timeout=10) for r in (failed, succeeded)]
    finally:
        stock.close()
    assert [(e["callId"], e["exitCode"]) for e in envelopes] == [(failed.call_id, 22), (succeeded.call_id, 0)]
