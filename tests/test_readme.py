"""The README's examples run as written, against a worker serving the repository's own definitions."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_worker, stop_worker, worker_env
from tests.servers import DnsServer, ServerThread
from worker.dev.demo import make_app
from worker.dev.embedded import EmbeddedRedis

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
README_URL = "redis://127.0.0.1:6390/0"

pytestmark = pytest.mark.integration


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.DOTALL)


@pytest.fixture(scope="module")
def demo_stack(dns_server: DnsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A worker on definitions/ with the demo upstream, like `make run`, on a Redis server of its own."""
    directory = tmp_path_factory.mktemp("readme")
    server = EmbeddedRedis(directory / "redis").start()
    demo = ServerThread(make_app()).start()
    env = worker_env(server.url, demo.url, dns_server.address, ROOT / "definitions")
    env["TOOLWORKER_DEMO_URL"] = demo.url
    process = start_worker(env, directory / "worker.log")
    yield server.url
    stop_worker(process)
    demo.stop()
    server.stop()


def run_snippet(code: str, redis_url: str) -> str:
    """Execute a README block with the README's Redis URL pointed at the test server."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace(README_URL, redis_url), "README.md", "exec"), {"__name__": "readme"})
    return out.getvalue()


def test_python_client_example(demo_stack: str) -> None:
    """The ToolClient example calls, submits, batches and searches through a real worker."""
    [block] = [b for b in code_blocks("python") if "from worker import ToolClient" in b]
    lines = run_snippet(block, demo_stack).splitlines()
    assert lines[0].startswith("0 200 ")
    assert json.loads(lines[0].split(" ", 2)[2])["status"] == "open"
    assert json.loads(lines[1])["city"] == "Paris"
    assert lines[2:4] == ["ticket_lookup 0", "weather_current 0"]
    assert "ticket_create" in lines[4]


def test_plain_redis_example(demo_stack: str) -> None:
    """Enqueuing with plain Redis commands (no Celery) gets the envelope on the reply stream."""
    [block] = [b for b in code_blocks("python") if "r.lpush" in b]
    output = run_snippet(block, demo_stack)
    code, result = output.strip().split(" ", 1)
    assert code == "0"
    assert json.loads(result)["id"] == "TICKET-123"


def test_documented_commands_exist() -> None:
    """Every `toolworker` subcommand the README shows answers --help."""
    commands = set(re.findall(r"toolworker (worker|call|tools|schema|validate|import-openapi|dev)\b", README))
    assert commands >= {"worker", "call", "tools", "schema", "validate", "import-openapi"}
    for command in sorted(commands):
        done = subprocess.run([sys.executable, "-m", "worker", command, "--help"], capture_output=True, timeout=60)
        assert done.returncode == 0, (command, done.stderr)


def test_documented_settings_exist() -> None:
    """Every TOOLWORKER_* variable in the README's configuration table is a setting."""
    from worker.settings import Settings

    documented = set(re.findall(r"`TOOLWORKER_([A-Z_]+)`", README)) - {"UPSTREAM_"}
    fields = {name.upper() for name in Settings.model_fields}
    assert documented - {"UPSTREAM_<NAME>_URL"} <= fields, documented - fields


def test_native_yaml_example_loads(tmp_path: Path) -> None:
    """The README's native-format example is a valid definitions file."""
    from worker.definitions import store

    [block] = [b for b in code_blocks("yaml") if "upstreams:" in b and "ticket_lookup" in b]
    path = tmp_path / "example.yaml"
    path.write_text(block)
    toolset = store.load([path], {"SUPPORT_TOKEN": "t"})
    assert toolset.problems == []
    assert set(toolset.tools) == {"ticket_lookup"}
    upstream = toolset.upstreams["support"]
    assert upstream.queue == "support" and upstream.rate_limit is not None
