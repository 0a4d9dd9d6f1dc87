"""Definitions published to Redis: workers switch versions live; a broken set changes nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis
from structlog.testing import capture_logs

from tests.conftest import Upstream, start_worker, stop_worker, wait_ready, worker_env
from tests.support.servers import DnsServer
from tests.support.waiting import Budget, scaled
from worker.client import ToolClient
from worker.constants import DEFINITIONS_BUNDLE_PREFIX, DEFINITIONS_CURRENT_KEY
from worker.definitions import redis_store
from worker.definitions.model import ToolSet
from worker.dev.embedded import EmbeddedRedis

TOOL = """
upstreams:
  local: {{base_url: "${{env:TEST_UPSTREAM_URL}}"}}
tools:
  - name: {name}
    upstream: local
    request: {{method: GET, path: /echo/{name}}}
"""


@pytest.fixture
def published_worker(tmp_path: Path, upstream: Upstream, dns_server: DnsServer) -> Iterator[tuple[str, Path]]:
    """A worker of its own reading the shared store of a Redis server of its own."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    defs = tmp_path / "defs"
    defs.mkdir()
    (defs / "tools.yaml").write_text(TOOL.format(name="first_tool"))
    client = redis.Redis.from_url(server.url)
    version, _ = redis_store.publish(client, [defs])
    assert version == 1
    env = worker_env(server.url, upstream.url, dns_server.address, tmp_path / "unused")
    env.update(TOOLWORKER_STORE="redis", TOOLWORKER_STORE_POLL_SECONDS="0.2")
    process = start_worker(env, tmp_path / "worker.log", "-Q", "toolcalls")
    wait_ready(process, tmp_path / "worker.log")
    yield server.url, defs
    stop_worker(process)
    client.close()
    server.stop()


def wait_for_tool(client: ToolClient, name: str, timeout_s: float = 20) -> int:
    """The exit code of a call of `name` once the worker knows the tool (64 while it does not yet)."""
    budget = Budget(timeout_s)
    while True:
        code = client.call(name, {}, timeout=scaled(10)).exit_code
        if code != 64 or budget.exhausted():
            return code
        time.sleep(0.1)


@pytest.mark.integration
def test_publish_switches_running_workers(published_worker: tuple[str, Path]) -> None:
    """A running worker serves version 1, then version 2 once it is published, without a restart."""
    url, defs = published_worker
    with ToolClient(url) as client:
        assert wait_for_tool(client, "first_tool") == 0
        (defs / "tools.yaml").write_text(TOOL.format(name="second_tool"))
        version, toolset = redis_store.publish(redis.Redis.from_url(url), [defs])
        assert version == 2 and not toolset.problems
        assert wait_for_tool(client, "second_tool") == 0
        assert client.call("first_tool", {}, timeout=scaled(10)).exit_code == 64
        assert [t["name"] for t in client.tools() if t["upstream"] == "local"] == ["second_tool"]


@pytest.mark.integration
def test_broken_set_is_refused_and_changes_nothing(published_worker: tuple[str, Path]) -> None:
    """Publishing a set with problems leaves the current version and what workers serve as they were."""
    url, defs = published_worker
    r = redis.Redis.from_url(url)
    (defs / "broken.yaml").write_text("tools:\n  - name: broken\n    upstream: nowhere\n")
    version, toolset = redis_store.publish(r, [defs])
    assert version == 0
    assert any(
        "unknown upstream 'nowhere'" in str(p) and f"{defs / 'broken.yaml'}:2" in str(p) for p in toolset.problems
    )
    assert r.get(DEFINITIONS_CURRENT_KEY) == b"1"
    with ToolClient(url) as client:
        assert wait_for_tool(client, "first_tool") == 0
    r.close()


def test_bundle_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    """A bundle naming a path outside its folder is refused when written out."""
    with pytest.raises(ValueError, match="escapes"):
        redis_store.materialize({"../evil.yaml": "x"}, tmp_path / "bundle")


def test_problems_of_a_bundle_name_the_files_on_disk(tmp_path: Path) -> None:
    """The bundle is what is checked; its problems point at the files they came from, root by root."""
    first, second = tmp_path / "a", tmp_path / "b" / "nested"
    second.mkdir(parents=True)
    first.mkdir()
    (first / "ok.yaml").write_text("upstreams:\n  up: {base_url: 'http://127.0.0.1:9'}\n")
    (second / "bad.yaml").write_text("tools:\n  - name: broken\n    upstream: nowhere\n")
    client = fakeredis.FakeRedis()
    version, toolset = redis_store.publish(client, [first, tmp_path / "b"])
    assert version == 0
    assert [p.source.file for p in toolset.problems] == [str(second / "bad.yaml")]
    assert client.get(DEFINITIONS_CURRENT_KEY) is None


# A spec split over two files: its input schemas are built on first use, and read the second file then.
SPLIT_SPEC = """
openapi: 3.0.3
info: {title: split, version: "1"}
paths:
  /echo/split:
    get:
      operationId: split_echo
      parameters:
        - {name: mode, in: query, required: true, schema: {$ref: "./schemas.yaml#/components/schemas/Mode"}}
      responses: {"200": {description: ok}}
"""
SPLIT_SCHEMAS = """
components:
  schemas:
    Mode: {type: string, enum: [fast, slow]}
"""
SPLIT_ENTRY = 'openapi:\n  - {upstream: split, spec: spec.yaml, base_url: "${env:TEST_UPSTREAM_URL}"}\n'


def write_split_spec(folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "spec.yaml").write_text(SPLIT_SPEC)
    (folder / "schemas.yaml").write_text(SPLIT_SCHEMAS)
    (folder / "tools.yaml").write_text(SPLIT_ENTRY)


def test_a_loaded_bundle_keeps_its_files_for_lazy_schemas(tmp_path: Path) -> None:
    """A published two-file spec still resolves its `$ref` to the other file when a schema is first built."""
    defs = tmp_path / "defs"
    write_split_spec(defs)
    client = fakeredis.FakeRedis()
    version, _ = redis_store.publish(client, [defs], environ={"TEST_UPSTREAM_URL": "http://127.0.0.1:9"})
    payload = redis_store.current_payload(client)
    assert version == 1 and payload is not None
    loaded, toolset = redis_store.Bundles().load(payload, environ={"TEST_UPSTREAM_URL": "http://127.0.0.1:9"})
    tool = toolset.tools["split_echo"]
    assert loaded == 1 and tool.schema_is_lazy
    assert tool.input_schema["properties"]["mode"]["enum"] == ["fast", "slow"]


def test_bundles_keep_the_current_and_previous_versions(tmp_path: Path) -> None:
    """Loading version 3 removes version 1's files; versions 2 and 3 stay for the calls that use them."""
    bundles = redis_store.Bundles()
    for version in (1, 2, 3):
        bundles.load(json.dumps({"version": version, "files": {"t.yaml": "upstreams: {}\n"}}))
    assert sorted(p.name for p in bundles.root.iterdir()) == ["v2", "v3"]


async def test_the_follower_skips_a_version_it_cannot_load_and_goes_on() -> None:
    """A published version that fails to load is logged and skipped; the next good one is served."""
    client = fakeredis.aioredis.FakeRedis()
    seen: list[int] = []
    good = json.dumps({"version": 3, "files": {"t.yaml": "upstreams: {}\n"}})
    await client.set(DEFINITIONS_BUNDLE_PREFIX + "2", "not json")
    await client.set(DEFINITIONS_CURRENT_KEY, 2)

    def on_version(version: int, toolset: ToolSet) -> None:
        seen.append(version)

    with capture_logs() as logs:
        task = asyncio.create_task(redis_store.follow(client, redis_store.Bundles(), 1, 0.01, on_version))
        while not any(entry["event"] == "definitions.load_failed" for entry in logs):
            await asyncio.sleep(0.01)
        await client.set(DEFINITIONS_BUNDLE_PREFIX + "3", good)
        await client.set(DEFINITIONS_CURRENT_KEY, 3)
        while not seen:
            await asyncio.sleep(0.01)
        task.cancel()
    assert (seen == [3] and not task.done()) or task.cancelled()
    failed = [entry for entry in logs if entry["event"] == "definitions.load_failed"]
    assert len(failed) == 1 and failed[0]["version"] == 2


@pytest.mark.integration
def test_a_published_two_file_spec_is_called(tmp_path: Path, upstream: Upstream, dns_server: DnsServer) -> None:
    """A worker on the shared store calls a tool of a two-file spec, its schema read from the second file."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    defs = tmp_path / "defs"
    write_split_spec(defs)
    client = redis.Redis.from_url(server.url)
    version, toolset = redis_store.publish(client, [defs], environ={"TEST_UPSTREAM_URL": upstream.url})
    assert version == 1, toolset.problems
    env = worker_env(server.url, upstream.url, dns_server.address, tmp_path / "unused")
    env.update(TOOLWORKER_STORE="redis")
    process = start_worker(env, tmp_path / "worker.log", "-Q", "toolcalls")
    try:
        wait_ready(process, tmp_path / "worker.log")
        with ToolClient(server.url) as tools:
            assert tools.call("split_echo", {"mode": "fast"}, timeout=scaled(20)).exit_code == 0
            refused = tools.call("split_echo", {"mode": "sideways"}, timeout=scaled(20))
            assert refused.exit_code == 65 and "fast" in (refused.error or {})["message"]
    finally:
        stop_worker(process)
        client.close()
        server.stop()
