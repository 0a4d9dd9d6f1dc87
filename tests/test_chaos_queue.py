"""Chaos on the queue: poison items of every shape, a burst of 10,000 of them, Redis paused and killed under load.

A real `redis-server` (AOF, every write fsynced before it is answered, so that it can be killed -9 and started
again on the same port without losing what it answered), a real worker process and a real upstream. Every
case asserts the promises, not only that the worker survived: one envelope per good call, nothing left in an
in-flight list, no secret in the worker's log, the worker alive and answering afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import FIXTURES, Upstream, start_worker, stop_worker, worker_env
from tests.support.redis_proc import RedisProcess
from tests.support.servers import DnsServer
from tests.support.waiting import wait_until
from worker.client import task_messages
from worker.constants import DEAD_LETTER_KEY, DEFAULT_QUEUE, RESULT_KEY_PREFIX
from worker.protocol import envelope_from_meta, task_message
from worker.queue import health
from worker.queue.leases import HOLDERS_KEY, INFLIGHT_PREFIX, inflight_key

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

SECRET = "chaos-s3cr3t-header-value-7731"
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # the default of TOOLWORKER_MAX_MESSAGE_BYTES


@dataclass
class ChaosStack:
    """A killable server, one worker on it, and where the worker logs."""

    server: RedisProcess
    env: dict[str, str]
    log_path: Path
    worker: subprocess.Popen[bytes]

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.server.url, socket_timeout=5)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, dns_server: DnsServer) -> Iterator[ChaosStack]:
    """One worker on its own killable server, answering before the first test."""
    directory = tmp_path_factory.mktemp("chaos")
    server = RedisProcess(directory / "redis").start()
    env = worker_env(server.url, upstream.url, dns_server.address, FIXTURES / "integration")
    log_path = directory / "worker.log"
    stack = ChaosStack(server, env, log_path, start_worker(env, log_path))
    try:
        with stack.client() as r:
            answer_calls(stack, r, [good_call("warm-up")], timeout_s=60)
        yield stack
    finally:
        stop_worker(stack.worker)
        server.stop()


# --- calls and what they were answered ----------------------------------------------------------


def good_call(item: str, stream: str = "chaos:warm-up") -> dict[str, Any]:
    deadline = (datetime.now(UTC) + timedelta(seconds=120)).isoformat()
    return {
        "callId": str(uuid.uuid4()),
        "tool": "echo_get",
        "arguments": {"item": item},
        "deadline": deadline,
        "replyTo": stream,
    }


def envelopes_by_call(r: redis.Redis, stream: str) -> Counter[str]:
    """How many envelopes each callId got on the reply stream."""
    counts: Counter[str] = Counter()
    after = "-"
    while entries := r.xrange(stream, min=after, count=5000):
        counts.update(json.loads(data[b"envelope"])["callId"] for _, data in entries)
        after = "(" + entries[-1][0].decode()
    return counts


def answer_calls(stack: ChaosStack, r: redis.Redis, calls: list[dict[str, Any]], timeout_s: float) -> None:
    """Enqueue the calls (one message each) and wait until each has an envelope on its stream."""
    for message in task_messages(calls, DEFAULT_QUEUE, 1):
        r.lpush(DEFAULT_QUEUE, message)
    wait_until(lambda: all_answered(r, calls), timeout_s, f"{len(calls)} envelopes\n{stack.log_text()[-3000:]}")


def all_answered(r: redis.Redis, calls: list[dict[str, Any]]) -> bool:
    streams = {call["replyTo"] for call in calls}
    answered = set().union(*(envelopes_by_call(r, stream) for stream in streams))
    return {call["callId"] for call in calls} <= answered


def held(r: redis.Redis) -> dict[str, int]:
    """Every in-flight list and its length."""
    return {key.decode(): int(r.llen(key)) for key in r.scan_iter(match=INFLIGHT_PREFIX + "*")}


def stored_envelope(r: redis.Redis, call_id: str) -> dict[str, Any] | None:
    raw = r.get(RESULT_KEY_PREFIX + call_id)
    return envelope_from_meta(raw) if raw is not None else None


def assert_promises_kept(stack: ChaosStack, r: redis.Redis, calls: list[dict[str, Any]], stream: str) -> None:
    """One envelope per call, all answered 0; nothing held once they are; no secret logged; the worker alive."""
    counts = envelopes_by_call(r, stream)
    assert set(counts) == {c["callId"] for c in calls}, f"{len(set(counts))} of {len(calls)} calls answered"
    assert max(counts.values()) == 1, f"answered twice: {[k for k, n in counts.items() if n > 1][:5]}"
    wait_until(lambda: not held(r), 20, f"the in-flight lists to empty: {held(r)}")
    assert stack.worker.poll() is None, "the worker exited:\n" + stack.log_text()[-3000:]
    log = stack.log_text()
    assert SECRET not in log
    assert "Unrecoverable error" not in log


# --- poison items, one at a time --------------------------------------------------------------------


def transport(body: Any, headers: dict[str, Any] | None, task_id: str) -> dict[str, Any]:
    """A Celery protocol 2 message around `body`, with these headers (none: no `headers` at all)."""
    message: dict[str, Any] = json.loads(task_message(task_id, [{"tool": "echo_get"}], DEFAULT_QUEUE))
    message["body"] = json.dumps(body)
    if headers is None:
        del message["headers"]
    else:
        message["headers"].update(headers)
    return message


def secret_call(task_id: str, stream: str) -> list[Any]:
    """The body of a call whose header carries the secret."""
    call = {"callId": task_id, "tool": "echo_get", "arguments": {"item": "x"}, "replyTo": stream}
    return [[{**call, "headers": {"X-User-Token": SECRET}}], {}, {}]


RAW_ITEMS = {
    "not_json": lambda: b"{not json at all \xff\xfe",
    "json_array": lambda: b"[1, 2, 3]",
    "json_string": lambda: b'"just a string"',
    "json_null": lambda: b"null",
    "binary_20mb": lambda: os.urandom(20 * 1024 * 1024),
    "deeply_nested": lambda: b"[" * 200_000 + b"]" * 200_000,
    "object_without_properties_or_headers": lambda: json.dumps({"hello": "world", "body": "x"}).encode(),
}


def poison(shape: str, task_id: str, stream: str) -> bytes:
    """One queue item of the given shape; `task_id` is the id it names, when it names one."""
    if shape in RAW_ITEMS:
        return RAW_ITEMS[shape]()
    if shape == "oversize_call":
        call = {"callId": task_id, "tool": "echo_get", "replyTo": stream, "arguments": {"item": "x" * (9 << 20)}}
        return task_message(task_id, [call], DEFAULT_QUEUE).encode()
    return json.dumps(transport_shaped(shape, task_id, stream)).encode()


def transport_shaped(shape: str, task_id: str, stream: str) -> dict[str, Any]:
    """A message carrying a call with a secret header, broken in the way `shape` says."""
    body = secret_call(task_id, stream)
    if shape == "object_without_headers":
        return transport(body, None, task_id)
    if shape == "unknown_task_with_a_secret_header":
        return transport(body, {"task": "not.a.task"}, task_id)
    if shape == "invalid_task_with_a_secret_header":
        return transport(body, {"expires": "not-a-date"}, task_id)
    message = transport(body, {}, task_id)
    if shape == "object_without_properties":
        del message["properties"]
    else:
        assert shape == "delivery_tag_not_a_string"
        message["properties"]["delivery_tag"] = 12
    return message


# shape -> (what the dead letter's reason says, whether the item's task id is answered 65)
POISON = {
    "not_json": ("not JSON", False),
    "json_array": ("not a transport message", False),
    "json_string": ("not a transport message", False),
    "json_null": ("not a transport message", False),
    "binary_20mb": (f"message over {MAX_MESSAGE_BYTES} bytes", False),
    "deeply_nested": ("not JSON", False),
    "object_without_properties_or_headers": ("not a transport message", False),
    "object_without_properties": ("not a transport message", True),
    "delivery_tag_not_a_string": ("not a transport message", True),
    "object_without_headers": ("not a task message", False),
    "unknown_task_with_a_secret_header": ("unknown task 'not.a.task'", False),
    "invalid_task_with_a_secret_header": ("invalid task message", False),
    "oversize_call": (f"message over {MAX_MESSAGE_BYTES} bytes", True),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", list(POISON))
def test_poison_item_is_dead_lettered_and_the_worker_goes_on(chaos: ChaosStack, shape: str) -> None:
    """A poison item is dead-lettered (its secret nowhere), answered 65 when it names its call, removed from
    the in-flight list; the good call behind it is answered once and the worker carries on."""
    stream, task_id = f"chaos:poison:{uuid.uuid4().hex}", str(uuid.uuid4())
    reason, answered = POISON[shape]
    with chaos.client() as r:
        r.delete(DEAD_LETTER_KEY)
        r.lpush(DEFAULT_QUEUE, poison(shape, task_id, stream + ":refused"))
        calls = [good_call(f"after-{shape}", stream)]
        answer_calls(chaos, r, calls, timeout_s=30)
        wait_until(lambda: r.llen(DEAD_LETTER_KEY) >= 1, 10, "the dead letter")
        assert_promises_kept(chaos, r, calls, stream)
        letters = [json.loads(raw) for raw in r.lrange(DEAD_LETTER_KEY, 0, -1)]
        refused, refusals = stored_envelope(r, task_id), envelopes_by_call(r, stream + ":refused")
    assert len(letters) == 1 and reason in letters[0]["reason"], letters
    assert SECRET not in json.dumps(letters)
    if answered:
        assert refused is not None and refused["exitCode"] == 65, refused
        assert refusals == {task_id: 1}
    else:
        assert refused is None and not refusals


@pytest.mark.timeout(120)
def test_a_burst_of_10000_poison_items_among_good_calls(chaos: ChaosStack) -> None:
    """10,000 poison items of seven shapes, 200 good calls among them: 10,000 dead letters, 200 envelopes, once
    each, nothing held, no secret logged."""
    stream = f"chaos:burst:{uuid.uuid4().hex}"
    shapes = ["not_json", "json_array", "json_string", "json_null", "object_without_properties_or_headers"]
    shapes += ["object_without_headers", "unknown_task_with_a_secret_header"]
    items = [poison(shapes[i % len(shapes)], str(uuid.uuid4()), stream) for i in range(10_000)]
    calls = [good_call(f"burst-{i}", stream) for i in range(200)]
    good = task_messages(calls, DEFAULT_QUEUE, 1)
    with chaos.client() as r:
        r.delete(DEAD_LETTER_KEY)
        for start in range(0, len(items), 50):  # a good call every 50 poison items
            r.lpush(DEFAULT_QUEUE, *items[start : start + 50], good[start // 50])
        wait_until(lambda: all_answered(r, calls), 90, "200 envelopes\n" + chaos.log_text()[-2000:])
        wait_until(lambda: r.llen(DEAD_LETTER_KEY) == 10_000, 30, "10,000 dead letters")
        assert_promises_kept(chaos, r, calls, stream)


# --- Redis paused, and killed, under load --------------------------------------------------------


class Producer(threading.Thread):
    """Enqueues `total` calls, a few every 10 ms; never while the server is being killed (`lock`)."""

    def __init__(self, url: str, stream: str, total: int) -> None:
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(url, socket_timeout=5)
        self.calls = [good_call(f"load-{i}", stream) for i in range(total)]
        self.sent = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        while self.sent < len(self.calls):
            with self.lock:
                batch = self.calls[self.sent : self.sent + 10]
                try:
                    self.r.lpush(DEFAULT_QUEUE, *task_messages(batch, DEFAULT_QUEUE, 1))
                except redis.ConnectionError:
                    continue  # the server is starting again: send the same calls once it answers
                self.sent += len(batch)
            time.sleep(0.01)


def run_under_load(chaos: ChaosStack, total: int, faults: int, fault: Any) -> tuple[redis.Redis, Producer, str]:
    """Stream `total` calls and inflict `fault(producer)` `faults` times, evenly spread over the stream."""
    stream = f"chaos:load:{uuid.uuid4().hex}"
    producer = Producer(chaos.server.url, stream, total)
    producer.start()
    for index in range(1, faults + 1):
        wait_until(lambda i=index: producer.sent >= total * i // (faults + 1), 60, "calls enqueued")
        fault(producer)
    producer.join(60)
    r = chaos.client()
    wait_until(lambda: all_answered(r, producer.calls), 90, f"{total} envelopes\n{chaos.log_text()[-3000:]}")
    return r, producer, stream


@pytest.mark.timeout(120)
def test_redis_paused_under_load_repeatedly(chaos: ChaosStack) -> None:
    """Redis stopped (SIGSTOP) for 2 s, four times, while 1,000 calls stream: every call answered once."""

    def pause(_: Producer) -> None:
        chaos.server.pause()
        time.sleep(2)  # the fault itself: the server is frozen this long
        chaos.server.resume()

    r, producer, stream = run_under_load(chaos, 1000, 4, pause)
    with r:
        assert_promises_kept(chaos, r, producer.calls, stream)
        assert r.hlen("unacked") == 0


@pytest.mark.timeout(180)
def test_redis_killed_and_restarted_under_load_repeatedly(chaos: ChaosStack) -> None:
    """Redis killed -9 and started again from its AOF six times while 2,000 calls stream: every call answered
    exactly once, no entry left in an in-flight list or kombu's unacked records, the worker answering."""

    def restart(producer: Producer) -> None:
        with producer.lock:
            chaos.server.kill()
            chaos.server.start()

    r, producer, stream = run_under_load(chaos, 2000, 6, restart)
    with r:
        assert_promises_kept(chaos, r, producer.calls, stream)
        wait_until(lambda: r.hlen("unacked") == 0, 20, "kombu's unacked records to empty")
        after = [good_call("after-the-restarts", stream)]
        answer_calls(chaos, r, after, timeout_s=30)
        assert envelopes_by_call(r, stream)[after[0]["callId"]] == 1


# --- health pings -------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_health_pings_leave_nothing_held(chaos: ChaosStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten health pings through the broker transport: each answered, and no reply left in an in-flight list."""
    monkeypatch.setenv("TOOLWORKER_REDIS_URL", chaos.server.url)  # where a probe would take a lease
    answers = [health.check(chaos.server.url, timeout_s=10) for _ in range(10)]
    with chaos.client() as r:
        left = held(r)
    assert all(ok for ok, _ in answers), answers
    assert not left, left


# --- a take and an acknowledgement lost in a Redis restart, made deterministic ----------------------


def worker_holder(r: redis.Redis, pid: int) -> str:
    """The lease holder name of the worker process `pid`."""
    holders = [h.decode() for h in r.smembers(HOLDERS_KEY) if h.decode().split(":")[1] == str(pid)]
    assert len(holders) == 1, holders
    return holders[0]


@pytest.mark.timeout(90)
def test_a_take_and_an_ack_lost_in_a_restart_are_made_good(chaos: ChaosStack) -> None:
    """A message in the live worker's in-flight list that it never received (a take Redis recorded but whose
    reply was lost) and one it already answered (an acknowledgement lost): after Redis restarts, the first
    is answered, the second not again, and neither stays held."""
    stream = f"chaos:lost:{uuid.uuid4().hex}"
    answered, never_received = good_call("answered", stream), good_call("never-received", stream)
    with chaos.client() as r:
        answer_calls(chaos, r, [answered], timeout_s=30)
        inflight = inflight_key(worker_holder(r, chaos.worker.pid), DEFAULT_QUEUE)
        r.lpush(
            inflight, *task_messages([answered], DEFAULT_QUEUE, 1), *task_messages([never_received], DEFAULT_QUEUE, 1)
        )
    chaos.server.kill()
    chaos.server.start()
    with chaos.client() as r:
        wait_until(
            lambda: all_answered(r, [never_received]), 30, "the call whose take was lost\n" + chaos.log_text()[-2000:]
        )
        assert_promises_kept(chaos, r, [answered, never_received], stream)
