"""Crash recovery by lease: a dead worker's calls come back in seconds, a live one's never, none lost.

Real worker processes and a real Redis-compatible server (the fault tests' stack); default settings
unless a test says otherwise. Figures worth reading are printed (`-s`).
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.conftest import start_worker
from tests.support.faults import (
    FAULTS,
    FaultUpstream,
    RawServer,
    Stack,
    enqueue,
    holdings,
    make_call,
    make_stack,
    per_call,
    report,
    stream_envelopes,
    wait_for_envelopes,
    warm_up,
)
from tests.support.servers import DnsServer
from tests.support.waiting import wait_until
from worker.constants import DEFAULT_QUEUE, RESULT_KEY_PREFIX, TASK_EXECUTE
from worker.protocol import envelope_from_meta
from worker.queue.broker import PAUSE_AFTER_TAKE_ENV
from worker.queue.leases import HOLDERS_KEY

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = 50


def start_victim(stack: Stack, index: int, pause_s: float = 0) -> subprocess.Popen[bytes]:
    """A worker of the stack to be killed; with `pause_s`, it waits that long between taking a message and
    handing it on (inside what was kombu's loss window)."""
    env = dict(stack.env)
    if pause_s:
        env[PAUSE_AFTER_TAKE_ENV] = str(pause_s)
    return start_worker(env, stack.logs / f"victim-{index}.log")


@pytest.mark.timeout(600)
def test_kill_storm_loses_nothing(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """A worker killed -9 and started again 50 times while calls stream (20 a second, 50 ms upstream) through it
    and a steady worker: every call answered exactly once; every fifth kill lands between taking a message and
    handing it on."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url)
    stream, tag = f"recovery:storm:{uuid.uuid4().hex}", uuid.uuid4().hex[:8]
    calls: list[dict[str, Any]] = []
    stop = threading.Event()
    rng = random.Random(7)
    try:
        stack.start_worker()
        warm_up(stack, "fast_get", {"id": "warm-up"})
        with stack.client() as r:

            def produce() -> None:
                while not stop.wait(0.1):
                    batch = [
                        make_call("outage_get", {"id": f"{tag}-{len(calls) + i}", "delay": 0.05}, stream, 300)
                        for i in range(2)
                    ]
                    enqueue(r, batch, batch=1)
                    calls.extend(batch)

            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            in_window = 0
            for kill in range(KILLS):
                paused = kill % 5 == 4
                victim = start_victim(stack, kill, pause_s=60 if paused else 0)
                if paused:  # it holds a message it has not handed on: kill it there
                    wait_until(lambda v=victim: holdings(r)[v.pid] > 0, 60, "the paused worker to take a message")
                    in_window += 1
                else:
                    time.sleep(rng.uniform(1.0, 3.0))
                victim.kill()
                victim.wait(10)
            stop.set()
            producer.join(30)
            wait_for_envelopes(r, stream, len(calls), 120)
            time.sleep(1)  # a late duplicate would arrive now
            envelopes = stream_envelopes(r, stream)
    finally:
        stop.set()
        stack.close()
    counts = per_call(envelopes)
    lost = len({c["callId"] for c in calls} - set(counts))
    twice = sum(1 for n in counts.values() if n > 1)
    report("kill storm", kills=KILLS, kills_inside_the_take=in_window, calls=len(calls), lost=lost, twice=twice)
    assert lost == 0 and twice == 0


@pytest.mark.timeout(300)
def test_a_long_call_under_a_live_worker_runs_once(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """A 120 s call under a live worker, with a 2 s lease and another worker sweeping: sent once, answered once."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url)
    stack.env["TOOLWORKER_LEASE_SECONDS"] = "2"
    try:
        stack.start_worker()
        stack.start_worker()
        warm_up(stack, "fast_get", {"id": "warm-up"})
        with stack.client() as r:
            wait_until(lambda: r.scard(HOLDERS_KEY) == 2, 60, "both workers taking messages")
            stream, key = f"recovery:long:{uuid.uuid4().hex}", uuid.uuid4().hex
            enqueue(r, [make_call("long_post", {"id": key, "delay": 120}, stream, 200)], batch=1)
            wait_for_envelopes(r, stream, 1, 180)
            time.sleep(5)  # two more sweeps: a second delivery would be under way now
            envelopes = stream_envelopes(r, stream)
    finally:
        stack.close()
    report("long call", seconds=120, posts=fault_upstream.state.posts[key], envelopes=len(envelopes))
    assert fault_upstream.state.posts[key] == 1
    assert [e["exitCode"] for e in envelopes] == [0]


@pytest.mark.timeout(120)
def test_sigterm_under_load_answers_every_call_and_holds_nothing(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """SIGTERM to one of two workers while 400 calls run and wait: every call answered once, nothing left held."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url)
    try:
        leaving = stack.start_worker()
        stack.start_worker()
        warm_up(stack, "fast_get", {"id": "warm-up"})
        with stack.client() as r:
            wait_until(lambda: r.scard(HOLDERS_KEY) == 2, 60, "both workers taking messages")
            stream = f"recovery:sigterm:{uuid.uuid4().hex}"
            calls = [make_call("outage_get", {"id": f"t{i}", "delay": 0.5}, stream, 100) for i in range(400)]
            enqueue(r, calls, batch=10)
            wait_until(lambda: fault_upstream.state.in_flight["outage"] > 0, 30, "calls in flight")
            leaving.terminate()
            code = leaving.wait(60)
            wait_for_envelopes(r, stream, len(calls), 60)
            time.sleep(1)
            counts = per_call(stream_envelopes(r, stream))
            held, unacked = sum(holdings(r).values()), r.hlen("unacked")
    finally:
        stack.close()
    assert code == 0, stack.log_tail()
    assert set(counts) == {c["callId"] for c in calls} and max(counts.values()) == 1
    assert held == 0 and unacked == 0


@pytest.mark.timeout(120)
def test_stock_producers_are_served(
    tmp_path: Path, fault_upstream: FaultUpstream, raw_upstream: RawServer, dns_server: DnsServer
) -> None:
    """Celery's own `send_task` (with and without a priority) and a plain LPUSH are taken and answered."""
    stack = make_stack(tmp_path, FAULTS / "pipeline", fault_upstream.url, dns_server, raw_upstream.url)
    producer = Celery("producer", broker=stack.server.url, set_as_current=False)
    try:
        stack.start_worker()
        warm_up(stack, "fast_get", {"id": "warm-up"})
        ids = [str(uuid.uuid4()) for _ in range(3)]
        send = producer.send_task
        send(TASK_EXECUTE, args=[{"tool": "fast_get", "arguments": {"id": "a"}}], task_id=ids[0], queue=DEFAULT_QUEUE)
        send(
            TASK_EXECUTE,
            args=[{"tool": "fast_get", "arguments": {"id": "b"}}],
            task_id=ids[1],
            queue=DEFAULT_QUEUE,
            priority=6,
        )
        with stack.client() as r:
            enqueue(r, [{**make_call("fast_get", {"id": "c"}, "unused"), "callId": ids[2]}], batch=1)
            wait_until(lambda: all(r.exists(RESULT_KEY_PREFIX + i) for i in ids), 30, "three envelopes")
            envelopes = [envelope_from_meta(r.get(RESULT_KEY_PREFIX + i) or b"{}") for i in ids]
    finally:
        producer.close()
        stack.close()
    assert [e["exitCode"] if e else None for e in envelopes] == [0, 0, 0]
    assert [json.loads(e["result"])["id"] if e else None for e in envelopes] == ["a", "b", "c"]
