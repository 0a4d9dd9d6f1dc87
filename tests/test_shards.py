"""Shards with real processes: three (then four) `redis-server`s on loopback, two `toolworker worker`s (each
a process per shard), a local upstream, the client of `worker/client.py` and the command line.

Each call's argument is unique, so the upstream's log says how many times each call reached it. Figures
worth reading are printed (`-s`).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from playwright.sync_api import Page

from tests.conftest import FIXTURES, Upstream, start_worker, stop_worker, wait_ready, worker_env
from tests.support.browser import browser, page
from tests.support.faults import report
from tests.support.gateway_stack import auth, gateway_env, start_gateway, wait_listening
from tests.support.redis_proc import RedisProcess
from tests.support.servers import DnsServer
from tests.support.waiting import scaled, wait_until
from worker.client import AsyncToolClient
from worker.constants import CLIENT_SLACK_S, RESULT_KEY_PREFIX
from worker.errors import RedisLost
from worker.queue.depth import queue_rows
from worker.shards import Shards

pytestmark = [pytest.mark.integration, pytest.mark.slow]
__all__ = ["browser", "page"]

TENANTS = [f"tenant-{i}" for i in range(60)]
A_TOKEN, B_TOKEN, OPS_TOKEN = "token-of-a-2f9c", "token-of-b-81d0", "token-of-ops-77ae"


@dataclass
class ShardStack:
    servers: dict[str, RedisProcess]
    env: dict[str, str]
    logs: Path
    upstream: Upstream
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def shards(self, *names: str) -> str:
        return " ".join(f"{name}={self.servers[name].url}" for name in names or sorted(self.servers))

    def start_worker(self, shards: str) -> subprocess.Popen[bytes]:
        """A `toolworker worker` on `shards`, once each of its processes (one per shard) is ready."""
        log = self.logs / f"worker-{len(self.workers)}.log"
        process = start_worker(self.env | {"TOOLWORKER_REDIS_SHARDS": shards}, log)
        self.workers.append(process)
        wait_ready(process, log, len(Shards.parse(shards).all))
        return process

    def holding(self, call_id: str) -> list[str]:
        """The shards that hold the call's result."""
        return [name for name, server in self.servers.items() if _client(server).exists(RESULT_KEY_PREFIX + call_id)]

    def idle(self) -> bool:
        """Nothing waiting or in flight on any shard that is up."""
        for server in self.servers.values():
            if server.process is not None and server.process.poll() is None:
                rows = queue_rows(_client(server))
                if any(row["waiting"] or row["in_flight"] for row in rows):
                    return False
        return True

    def hits(self, prefix: str) -> Counter[str]:
        return Counter(path for _, path in self.upstream.state.hits if path.startswith(prefix))


def _client(server: RedisProcess) -> redis.Redis:
    return redis.Redis(port=server.port, socket_connect_timeout=1.0, socket_timeout=5.0)


@contextmanager
def shard_stack(base: Path, upstream: Upstream, dns: DnsServer, names: tuple[str, ...]) -> Iterator[ShardStack]:
    servers = {name: RedisProcess(base / name).start() for name in names}
    # The URL points nowhere: with shards it is ignored.
    env = worker_env("redis://127.0.0.1:1/0", upstream.url, dns.address, shard_definitions(base / "definitions"))
    stack = ShardStack(servers, env, base, upstream)
    try:
        yield stack
    finally:
        for process in stack.workers:
            stop_worker(process)
        for server in servers.values():
            server.stop()


def shard_definitions(directory: Path) -> Path:
    """The integration tools, their upstream given 30 s to answer instead of 1.5 s: the upstream shares this
    process (and its GIL) with the tests' producers and a worker process per shard, and on a busy machine it
    answers in seconds. These tests count calls, not time; the pipeline tests keep the 1.5 s they time."""
    tools = (FIXTURES / "integration" / "tools.yaml").read_text()
    assert tools.count("timeout_seconds: 1.5") == 1
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tools.yaml").write_text(tools.replace("timeout_seconds: 1.5", "timeout_seconds: 30"))
    return directory


def item(tag: str, tenant: str, index: int) -> str:
    return f"{tag}-{tenant}-{index}"


async def call_all(client: AsyncToolClient, tag: str, tenants: list[str], per_tenant: int) -> dict[str, Any]:
    """`per_tenant` echo calls for each tenant, all at once: item -> (tenant, result)."""
    keys = [(tenant, item(tag, tenant, i)) for tenant in tenants for i in range(per_tenant)]
    calls = (client.acall("echo_get", {"item": key}, tenant=tenant, timeout=scaled(60)) for tenant, key in keys)
    results = await asyncio.gather(*calls)
    return {key: (tenant, result) for (tenant, key), result in zip(keys, results, strict=True)}


@pytest.fixture
def stack(tmp_path: Path, upstream: Upstream, dns_server: DnsServer) -> Iterator[ShardStack]:
    with shard_stack(tmp_path, upstream, dns_server, ("s1", "s2", "s3")) as made:
        for _ in range(2):
            made.start_worker(made.shards())
        yield made


def test_sixty_tenants_are_served_each_on_its_own_shard_once(stack: ShardStack) -> None:
    placement = Shards.parse(stack.shards())

    async def run() -> dict[str, Any]:
        client = AsyncToolClient(shards=stack.shards())
        try:
            return await call_all(client, "spread", TENANTS, 4)
        finally:
            await client.aclose()

    answered = asyncio.run(run())
    assert all(result.exit_code == 0 for _, result in answered.values()), [
        r.to_dict() for _, r in answered.values() if r.exit_code
    ][:3]
    for key, (tenant, result) in answered.items():
        assert json.loads(result.result)["path"] == f"/echo/items/{key}"
        assert stack.holding(result.call_id) == [placement.of(tenant).name], key
    hits = stack.hits("/echo/items/spread-")
    assert len(hits) == len(answered) and set(hits.values()) == {1}  # every call reached the upstream once
    per_shard = Counter(placement.of(tenant).name for tenant in TENANTS)
    assert set(per_shard) == {"s1", "s2", "s3"}
    wait_until(stack.idle, 20, "every shard's queues empty")
    report("shards.spread", calls=len(answered), tenants_per_shard=dict(per_shard))


def test_the_command_line_names_a_tenants_shard_and_counts_every_shard(stack: ShardStack) -> None:
    env = stack.env | {"TOOLWORKER_REDIS_SHARDS": stack.shards()}
    placement = Shards.parse(stack.shards())
    run = [sys.executable, "-m", "worker"]

    def toolworker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*run, *args], env=env, capture_output=True, text=True, check=check)

    named = toolworker("shards", "--tenant", "tenant-7")
    assert named.stdout.split()[0] == placement.of("tenant-7").name
    listed = toolworker("shards")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["s1", "s2", "s3"]
    assert "(home)" in listed.stdout.splitlines()[0]

    async def park() -> None:  # calls waiting on s2: no worker takes them while its servers' workers are away
        client = AsyncToolClient(shards=stack.shards())
        try:
            tenant = next(t for t in TENANTS if placement.of(t).name == "s2")
            await client.submit_many([("echo_get", {"item": item("cli", tenant, i)}) for i in range(3)], tenant=tenant)
        finally:
            await client.aclose()

    for process in stack.workers:
        stop_worker(process)
    stack.workers.clear()
    asyncio.run(park())
    shown = toolworker("queue", "--format", "json")
    rows = json.loads(shown.stdout)
    assert {row["shard"] for row in rows} == {"s1", "s2", "s3"}
    # (the queue's own list holds a wake-up token while no worker waits: counted under `default`)
    waiting = {(row["shard"], row["tenant"]): row["waiting"] for row in rows if row["waiting"]}
    tenant = next(t for t in TENANTS if placement.of(t).name == "s2")
    assert {key: count for key, count in waiting.items() if key[1] != "default"} == {("s2", tenant): 1}
    stack.servers["s3"].kill()
    partial = toolworker("queue", check=False)
    assert partial.returncode == 1 and "shard s3 (127.0.0.1:" in partial.stderr
    assert any(line.startswith("s2 ") for line in partial.stdout.splitlines())  # the others are shown


def test_a_shard_killed_under_load_stops_only_its_own_tenants(stack: ShardStack) -> None:
    """kill -9 of s2 while its calls are queued and others' calls stream: the others carry on, a call for
    an s2 tenant raises naming the shard, and once s2 is back (from its append-only file) its queued calls
    are answered once, new ones within seconds, with no worker restarted."""
    placement = Shards.parse(stack.shards())
    victims = [t for t in TENANTS if placement.of(t).name == "s2"][:4]
    others = [t for t in TENANTS if placement.of(t).name != "s2"][:12]
    slow_before = stack.hits("/slow").total()
    failures: list[str] = []
    streamed: list[int] = []
    stop = threading.Event()

    async def stream() -> None:
        client = AsyncToolClient(shards=stack.shards())
        try:
            round_ = 0
            while not stop.is_set():
                answered = await call_all(client, f"other{round_}", others, 1)
                failures.extend(repr(r.to_dict()) for _, r in answered.values() if r.exit_code)
                streamed.append(len(answered))
                round_ += 1
        except Exception as exc:  # a call of a live shard's tenant must not fail
            failures.append(repr(exc))
        finally:
            await client.aclose()

    async def scenario() -> tuple[list[str], float, float]:
        client = AsyncToolClient(shards=stack.shards())
        try:
            queued: list[str] = []
            for tenant in victims:  # 20 workers' slots (2 x 8, plus the others'), 240 calls of 0.2 s: seconds of work
                specs = [("slow", {"delay": 0.2})] * 60
                queued += await client.submit_many(specs, tenant=tenant, timeout=120)
            await asyncio.sleep(0.5)
            stack.servers["s2"].kill()
            started = time.monotonic()
            # In the same flush as a call of a live shard's tenant: that one is answered, this one raises.
            lost, alive = await asyncio.gather(
                client.acall("echo_get", {"item": "during"}, tenant=victims[0], timeout=3),
                client.acall("echo_get", {"item": item("alive", others[0], 0)}, tenant=others[0], timeout=10),
                return_exceptions=True,
            )
            raised_after = time.monotonic() - started
            assert isinstance(lost, RedisLost) and re.search(r"shard s2 \(127\.0\.0\.1:\d+\)", str(lost)), lost
            assert not isinstance(alive, BaseException) and alive.exit_code == 0, alive
            # Away for 12 s, the others streaming meanwhile: kombu's own reconnect tries would by now be 6 s
            # apart (2, 4, 6 ... s); the workers' stay a second apart.
            await asyncio.sleep(12)
            stack.servers["s2"].start()
            back = time.monotonic()
            first = await client.acall("echo_get", {"item": item("back", victims[1], 0)}, tenant=victims[1], timeout=30)
            assert first.exit_code == 0, first.to_dict()
            return queued, raised_after, time.monotonic() - back
        finally:
            await client.aclose()

    streamer = threading.Thread(target=lambda: asyncio.run(stream()))
    streamer.start()
    try:
        queued, raised_after, served_after = asyncio.run(scenario())
    finally:
        stop.set()
        streamer.join(60)
    assert not failures, failures[:3]
    assert raised_after <= 3 + CLIENT_SLACK_S + 2, raised_after
    assert served_after <= 3.5, served_after  # within seconds of its return (kombu's own backoff: over 5 s)
    wait_until(lambda: all(stack.holding(call_id) == ["s2"] for call_id in queued), 90, "every queued s2 call answered")
    wait_until(stack.idle, 30, "every shard's queues empty")
    assert stack.hits("/slow").total() - slow_before == len(queued)  # each reached the upstream once
    assert all(process.poll() is None for process in stack.workers)
    assert "child_restarted" not in "".join(p.read_text() for p in stack.logs.glob("worker-*.log"))
    report(
        "shards.kill",
        streamed_calls=sum(streamed),
        queued_on_s2=len(queued),
        raised_after_s=round(raised_after, 2),
        served_again_after_s=round(served_after, 2),
    )


def test_a_shard_added_by_a_rolling_restart_loses_nothing_and_runs_nothing_twice(
    tmp_path: Path, upstream: Upstream, dns_server: DnsServer
) -> None:
    """Workers move from three shards to four one at a time while two producers stream calls, one with the
    old list and one with the new: every call answered once, each where its producer sent it."""
    with shard_stack(tmp_path, upstream, dns_server, ("s1", "s2", "s3", "s4")) as stack:
        old, new = stack.shards("s1", "s2", "s3"), stack.shards()
        before, after = Shards.parse(old), Shards.parse(new)
        moved = [t for t in TENANTS if before.of(t).name != after.of(t).name]
        assert moved and all(after.of(t).name == "s4" for t in moved)
        first = [stack.start_worker(old) for _ in range(2)]
        answered: dict[str, tuple[str, str, Any]] = {}  # item -> (list, tenant, result)
        errors: list[str] = []
        stop = threading.Event()

        def produce(shards: str, label: str) -> None:
            async def run() -> None:
                client = AsyncToolClient(shards=shards)
                try:
                    round_ = 0
                    while not stop.is_set():
                        got = await call_all(client, f"{label}{round_}-{uuid.uuid4().hex[:6]}", TENANTS, 1)
                        answered.update({key: (label, tenant, result) for key, (tenant, result) in got.items()})
                        round_ += 1
                except Exception as exc:
                    errors.append(repr(exc))
                finally:
                    await client.aclose()

            asyncio.run(run())

        lists = ((old, "old"), (new, "new"))
        producers = [threading.Thread(target=produce, args=(shards, label)) for shards, label in lists]
        for producer in producers:
            producer.start()
        try:
            for process in first:  # the rolling restart: a new worker in, an old one out
                stack.start_worker(new)
                stop_worker(process)
                stack.workers.remove(process)
                time.sleep(1)
        finally:
            stop.set()
            for producer in producers:
                producer.join(120)
        assert not errors, errors[:3]
        failed = [(label, tenant, r.exit_code, r.error) for label, tenant, r in answered.values() if r.exit_code]
        assert not failed, (len(failed), failed[:3])
        for key, (label, tenant, result) in answered.items():
            expected = (before if label == "old" else after).of(tenant).name
            assert stack.holding(result.call_id) == [expected], key
        hits = stack.hits("/echo/items/")
        assert all(hits[f"/echo/items/{key}"] == 1 for key in answered)
        wait_until(stack.idle, 30, "every shard's queues empty")
        on_new = sum(1 for label, tenant, _ in answered.values() if label == "new" and tenant in moved)
        assert on_new > 0
        report("shards.add", calls=len(answered), moved_tenants=len(moved), calls_on_the_new_shard=on_new)


def test_the_gateway_serves_each_principals_tenant_on_its_shard_and_decides_on_any_shard(
    tmp_path: Path, upstream: Upstream, dns_server: DnsServer, page: Page
) -> None:
    """Through the gateway (REST), its console (a real browser) and the command line, with shards: a
    principal's calls go to its tenant's shard; a call parked for approval on a shard other than the home
    one is listed, approved and answered once; one denied from the command line is answered 77; the
    console's fleet page shows every shard's workers and queues."""
    definitions = FIXTURES / "approvals"
    with shard_stack(tmp_path, upstream, dns_server, ("s1", "s2", "s3")) as stack:
        shards = stack.shards()
        placement = Shards.parse(shards)
        on = {name: next(t for t in TENANTS if placement.of(t).name == name) for name in ("s2", "s3")}
        access = tmp_path / "access.yaml"
        access.write_text(
            "tokens:\n"
            f'  a: {{token: "{A_TOKEN}", tools: ["*"], tenant: {on["s2"]}}}\n'
            f'  b: {{token: "{B_TOKEN}", tools: ["*"], tenant: {on["s3"]}}}\n'
            f'  ops: {{token: "{OPS_TOKEN}", tools: ["*"], grants: [approve, operate]}}\n'
        )
        stack.env = stack.env | {"TOOLWORKER_DEFINITIONS": str(definitions)}
        stack.start_worker(shards)
        extra = {"TOOLWORKER_REDIS_SHARDS": shards, "TOOLWORKER_GATEWAY_ACCESS": str(access)}
        gateway = start_gateway(gateway_env("redis://127.0.0.1:1/0", definitions, **extra), tmp_path / "gateway.log")
        try:
            wait_listening(gateway, ready=True)
            url, name = gateway.url, uuid.uuid4().hex[:10]

            def call(token: str, tool: str) -> httpx2.Response:
                body = {"tool": tool, "arguments": {"item": name}}
                return httpx2.post(f"{url}/v1/calls", json=body, headers=auth(token), timeout=60)

            for token, shard in ((A_TOKEN, "s2"), (B_TOKEN, "s3")):
                read = call(token, "read_item")
                assert read.status_code == 200 and read.json()["exitCode"] == 0, read.text
                assert stack.holding(read.json()["callId"]) == [shard]
            parked = call(A_TOKEN, "delete_item")
            assert parked.status_code == 202, parked.text
            call_id = parked.json()["callId"]

            def listed() -> dict[str, Any]:
                rows = httpx2.get(f"{url}/v1/approvals", headers=auth(OPS_TOKEN), timeout=30).json()["approvals"]
                return {row["callId"]: row for row in rows}

            wait_until(lambda: call_id in listed(), 30, "the call parked on s2 listed")
            assert listed()[call_id]["tenant"] == on["s2"]
            body = {"decision": "approve", "reason": "fine"}
            approved = httpx2.post(f"{url}/v1/approvals/{call_id}", json=body, headers=auth(OPS_TOKEN), timeout=30)
            assert approved.status_code == 200, approved.text
            answer = httpx2.get(f"{url}/v1/calls/{call_id}?waitSeconds=30", headers=auth(A_TOKEN), timeout=60)
            assert answer.status_code == 200 and answer.json()["exitCode"] == 0, answer.text
            assert stack.holding(call_id) == ["s2"] and stack.hits(f"/echo/delete/{name}").total() == 1

            denied = call(B_TOKEN, "delete_item").json()["callId"]
            env = stack.env | {"TOOLWORKER_REDIS_SHARDS": shards}
            argv = [sys.executable, "-m", "worker", "approvals"]

            def cli(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=60, check=True)

            wait_until(lambda: denied in cli("list").stdout, 30, "the call parked on s3 listed by the command line")
            cli("deny", denied, "--reason", "no")
            answer = httpx2.get(f"{url}/v1/calls/{denied}?waitSeconds=30", headers=auth(B_TOKEN), timeout=60)
            assert answer.json()["exitCode"] == 77 and stack.holding(denied) == ["s3"]
            assert stack.hits(f"/echo/delete/{name}").total() == 1  # the denied one was never sent

            page.goto(url + "/console/login")
            page.get_by_label("Token").fill(OPS_TOKEN)
            page.get_by_label("Token").press("Enter")
            page.wait_for_url("**/console/fleet")
            headers = page.locator("#tenants thead th").all_inner_texts()
            assert headers[:2] == ["Shard", "Queue"]
            rows = page.locator("#tenants tbody tr")
            shown = {tuple(rows.nth(i).locator("td").all_inner_texts()[:2]) for i in range(rows.count())}
            assert shown == {
                (shard, queue) for shard in ("s1", "s2", "s3") for queue in ("toolcalls", "approvals-brief")
            }
            workers = " ".join(page.locator("main table").first.locator("td").all_inner_texts())
            assert all(f"-{shard}-0@" in workers for shard in ("s1", "s2", "s3")), workers
        finally:
            gateway.stop()
