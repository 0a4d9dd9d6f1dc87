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
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer, ServerThread
from worker.definitions.file_store import load
from worker.dev.demo import make_app
from worker.dev.embedded import EmbeddedRedis

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
README_URL = "redis://127.0.0.1:6390/0"
README_GATEWAY = "http://127.0.0.1:8780"

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


def run_snippet(code: str, redis_url: str, gateway_url: str = README_GATEWAY) -> str:
    """Execute a README block with the README's Redis URL (and gateway) pointed at the test servers."""
    out = io.StringIO()
    code = code.replace(README_URL, redis_url).replace(README_GATEWAY, gateway_url)
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    return out.getvalue()


@pytest.fixture(scope="module")
def readme_gateway(demo_stack: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway like `make run`'s: the repository's definitions, no tokens (so loopback only)."""
    env = gateway_env(
        demo_stack, ROOT / "definitions", TOOLWORKER_GATEWAY_TOKENS="", TOOLWORKER_GATEWAY_PAGE_SIZE="100"
    )
    gateway = start_gateway(env, tmp_path_factory.mktemp("readme-gateway") / "gateway.log")
    try:
        wait_listening(gateway, ready=True)
        yield gateway
    finally:
        gateway.stop()


def test_mcp_example(demo_stack: str, readme_gateway: Gateway) -> None:
    """The MCP example lists the tools and calls one through the gateway, with the SDK's client."""
    [block] = [b for b in code_blocks("python") if "from mcp import Client" in b]
    lines = run_snippet(block, demo_stack, readme_gateway.url).splitlines()
    assert lines[0] == "8 catalog_list"  # the five demo tools (my_profile acts for its user) and three catalog tools
    is_error, status, text = lines[1].split(" ", 2)
    assert (is_error, status) == ("False", "200") and json.loads(text)["id"] == "TICKET-123"


def test_toolserver_and_rest_examples(demo_stack: str, readme_gateway: Gateway) -> None:
    """The ToolServer example reads a schema and executes a tool; the REST one queues a call and fetches it."""
    [toolserver] = [b for b in code_blocks("python") if "/toolserver/" in b]
    assert run_snippet(toolserver, demo_stack, readme_gateway.url).splitlines() == ["ticket_lookup", "open"]
    [rest] = [b for b in code_blocks("python") if "/v1/calls" in b]
    assert run_snippet(rest, demo_stack, readme_gateway.url).splitlines() == ["202 pending", "200 0 Oslo"]


def test_desktop_client_config_runs_toolworker_mcp() -> None:
    """The desktop client entry is JSON that runs `toolworker mcp` with the settings it needs."""
    [block] = [b for b in code_blocks("json") if "mcpServers" in b]
    entry = json.loads(block)["mcpServers"]["toolworker"]
    assert entry["command"].endswith("/toolworker") and entry["args"] == ["mcp"]
    assert set(entry["env"]) == {"TOOLWORKER_REDIS_URL", "TOOLWORKER_DEFINITIONS"}


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


def test_tenant_examples(demo_stack: str, tmp_path: Path) -> None:
    """The tenants' client example runs, their limits load, and the other-language recipe is answered."""
    [client] = [b for b in code_blocks("python") if "TenantQueueFull" in b]
    assert run_snippet(client, demo_stack).splitlines() == ["0"]
    [recipe] = [b for b in code_blocks("python") if "toolworker:tenants:ring:toolcalls" in b]
    assert run_snippet(recipe, demo_stack).splitlines() == ["0"]
    [limits] = [b for b in code_blocks("yaml") if b.startswith("tenants:")]
    path = tmp_path / "tenants.yaml"
    path.write_text(limits, encoding="utf-8")
    toolset = load([path], environ={})
    assert toolset.problems == [] and toolset.tenants["live"].weight == 4


def test_documented_commands_exist() -> None:
    """Every `toolworker` subcommand the README shows answers --help."""
    pattern = r"toolworker (worker|call|tools|schema|validate|import-openapi|dev|gateway|mcp|audit|queue)\b"
    commands = set(re.findall(pattern, README))
    expected = {"worker", "call", "tools", "schema", "validate", "import-openapi", "gateway", "mcp", "audit", "queue"}
    assert commands >= expected
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
    from worker.definitions import file_store

    [block] = [b for b in code_blocks("yaml") if "upstreams:" in b and "ticket_lookup" in b]
    path = tmp_path / "example.yaml"
    path.write_text(block)
    toolset = file_store.load([path], {"SUPPORT_TOKEN": "t"})
    assert toolset.problems == []
    assert set(toolset.tools) == {"ticket_lookup"}
    upstream = toolset.upstreams["support"]
    assert upstream.queue == "support" and upstream.rate_limit is not None


def test_authentication_example_loads(tmp_path: Path) -> None:
    """The README's authentication example is a valid definitions file, with one upstream per auth type."""
    from worker.definitions import file_store

    [block] = [b for b in code_blocks("yaml") if "oauth2_client_credentials" in b and "per_call_header" in b]
    path = tmp_path / "auth.yaml"
    path.write_text(block)
    toolset = file_store.load([path], {})
    assert toolset.problems == []
    kinds = {name: upstream.auth.type for name, upstream in toolset.upstreams.items() if upstream.auth}
    assert sorted(kinds.values()) == ["api_key", "basic", "bearer", "bearer", "oauth2_client_credentials"]


def test_access_file_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's access file is valid: its tokens resolve, its scopes grant, its audience is as written."""
    from worker.gateway.identity import access_problems, load_access
    from worker.settings import Settings

    [block] = [b for b in code_blocks("yaml") if "principal_claim" in b]
    secret = tmp_path / "ops-token"
    secret.write_text("ops-secret")
    path = tmp_path / "access.yaml"
    path.write_text(block.replace("/run/secrets/ops-token", str(secret)))
    monkeypatch.setenv("CI_BOT_TOKEN", "ci-secret")
    assert access_problems(Settings(gateway_access=path)) == []
    access = load_access(path)
    assert access.oauth is not None and access.oauth.audience == "https://tools.example.com/mcp"
    assert access.oauth.scopes["tools.all"].grant().everything
