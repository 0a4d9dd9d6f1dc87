"""Definitions published to Redis: workers switch versions live; a broken set changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from tests.conftest import Upstream, start_worker, stop_worker, worker_env
from tests.servers import DnsServer
from worker.client import ToolClient
from worker.constants import DEFINITIONS_CURRENT_KEY
from worker.definitions import store
from worker.dev.embedded import EmbeddedRedis

pytestmark = pytest.mark.integration

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
    version, _ = store.publish(client, [defs])
    assert version == 1
    env = worker_env(server.url, upstream.url, dns_server.address, tmp_path / "unused")
    env.update(TOOLWORKER_STORE="redis", TOOLWORKER_STORE_POLL_SECONDS="0.2")
    process = start_worker(env, tmp_path / "worker.log", "-Q", "toolcalls")
    yield server.url, defs
    stop_worker(process)
    client.close()
    server.stop()


def wait_for_tool(client: ToolClient, name: str, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        code = client.call(name, {}, timeout=10).exit_code
        if code != 64 or time.monotonic() > deadline:
            return code
        time.sleep(0.1)


def test_publish_switches_running_workers(published_worker: tuple[str, Path]) -> None:
    """A running worker serves version 1, then version 2 once it is published, without a restart."""
    url, defs = published_worker
    with ToolClient(url) as client:
        assert wait_for_tool(client, "first_tool") == 0
        (defs / "tools.yaml").write_text(TOOL.format(name="second_tool"))
        version, toolset = store.publish(redis.Redis.from_url(url), [defs])
        assert version == 2 and not toolset.problems
        assert wait_for_tool(client, "second_tool") == 0
        assert client.call("first_tool", {}).exit_code == 64
        assert [t["name"] for t in client.tools() if t["upstream"] == "local"] == ["second_tool"]


def test_broken_set_is_refused_and_changes_nothing(published_worker: tuple[str, Path]) -> None:
    """Publishing a set with problems leaves the current version and what workers serve as they were."""
    url, defs = published_worker
    r = redis.Redis.from_url(url)
    (defs / "broken.yaml").write_text("tools:\n  - name: broken\n    upstream: nowhere\n")
    version, toolset = store.publish(r, [defs])
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
        store.materialize({"../evil.yaml": "x"}, tmp_path / "bundle")


def test_problems_of_a_bundle_name_the_files_on_disk(tmp_path: Path) -> None:
    """The bundle is what is checked; its problems point at the files they came from, root by root."""
    first, second = tmp_path / "a", tmp_path / "b" / "nested"
    second.mkdir(parents=True)
    first.mkdir()
    (first / "ok.yaml").write_text("upstreams:\n  up: {base_url: 'http://127.0.0.1:9'}\n")
    (second / "bad.yaml").write_text("tools:\n  - name: broken\n    upstream: nowhere\n")
    client = fakeredis.FakeRedis()
    version, toolset = store.publish(client, [first, tmp_path / "b"])
    assert version == 0
    assert [p.source.file for p in toolset.problems] == [str(second / "bad.yaml")]
    assert client.get(DEFINITIONS_CURRENT_KEY) is None
