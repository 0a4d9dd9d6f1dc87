"""The documentation's examples run as written: README.md and every page under docs/, against a worker and a
gateway serving the repository's own definitions, like `make run`'s.

Which fenced blocks run, and how (docs/contributing.md, "Examples are tests", says the same to writers):

- ```python   executed whole, with `redis://127.0.0.1:6390/0` and `http://127.0.0.1:8780` pointed at this
              module's servers; it must not raise. Blocks a test below picks out by their text have their
              printed output checked too; the others run in `test_python_examples_run`.
- ```yaml     a definitions file that `toolworker validate` accepts (unset `${env:...}` allowed); a block
              whose keys are an access file's (`tokens:`, `oauth:`) is checked as the gateway's access file.
- ```sh       every line a command: `make T` names a Makefile target; `toolworker ...` (after `VAR=value`
  ```bash     assignments) is accepted by the CLI's parser, and `call`, `tools`, `schema` and `validate` run
              for real and exit 0; a `TOOLWORKER_*` variable set on a line is a setting; any other command
              is refused (fence it as `text`).
- ```json, ```text, ```http and blocks without a language are illustrations, not run (a test may read one).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import start_worker, stop_worker, worker_env
from tests.support.gateway_stack import Gateway, gateway_env, start_gateway, wait_listening
from tests.support.servers import DnsServer, ServerThread
from worker.cli import parser
from worker.definitions.file_store import load
from worker.dev.demo import make_app
from worker.dev.embedded import EmbeddedRedis

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_URL = "redis://127.0.0.1:6390/0"
README_GATEWAY = "http://127.0.0.1:8780"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<language>[\w+-]*)")
# `toolworker` commands that read only local files or call through the queue: a docs line naming one runs.
RUNNABLE = {"call", "tools", "schema", "validate"}


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it is (page and line), its language and its text, dedented to its fence."""

    page: Path
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text(encoding="utf-8").splitlines()
    row = 0
    while row < len(lines):
        opening = FENCE.match(lines[row])
        if not opening:
            row += 1
            continue
        indent, fence, body = len(opening["indent"]), opening["fence"], []
        row += 1
        while row < len(lines) and not lines[row].strip().startswith(fence):
            body.append(lines[row][indent:] if lines[row][:indent].strip() == "" else lines[row])
            row += 1
        found.append(Block(page, row - len(body), opening["language"].lower(), "\n".join(body) + "\n"))
        row += 1
    return found


BLOCKS = [block for page in PAGES for block in page_blocks(page)]


def blocks_of(*languages: str) -> list[Block]:
    return [block for block in BLOCKS if block.language in languages]


def code_blocks(language: str) -> list[str]:
    return [block.text for block in blocks_of(language)]


def the_block(language: str, marker: str) -> str:
    """The one block of the docs in this language that holds the marker (an example lives on one page)."""
    found = [block for block in blocks_of(language) if marker in block.text]
    assert len(found) == 1, f"{len(found)} {language} blocks hold {marker!r}: {[b.where for b in found]}"
    return found[0].text


def docs_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


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


def run_snippet(code: str, redis_url: str, gateway_url: str = README_GATEWAY, where: str = "docs") -> str:
    """Execute a docs block with the docs' Redis URL (and gateway) pointed at the test servers."""
    out = io.StringIO()
    code = code.replace(README_URL, redis_url).replace(README_GATEWAY, gateway_url)
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), {"__name__": "docs_example"})
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


# Blocks whose output a test below checks: the generic runner leaves them to it.
CHECKED = (
    "from mcp import Client",
    "/toolserver/",
    "/v1/calls",
    "client.search(",
    "r.lpush",
    "TenantQueueFull",
    "toolworker:tenants:ring",
    'print(client.call("ticket_lookup"',
)


@pytest.mark.integration
def test_mcp_example(demo_stack: str, readme_gateway: Gateway) -> None:
    """The MCP example lists the tools and calls one through the gateway, with the SDK's client."""
    block = the_block("python", "from mcp import Client")
    lines = run_snippet(block, demo_stack, readme_gateway.url).splitlines()
    assert lines[0] == "8 catalog_list"  # the five demo tools (my_profile acts for its user) and three catalog tools
    is_error, status, text = lines[1].split(" ", 2)
    assert (is_error, status) == ("False", "200") and json.loads(text)["id"] == "TICKET-123"


@pytest.mark.integration
def test_toolserver_and_rest_examples(demo_stack: str, readme_gateway: Gateway) -> None:
    """The ToolServer example reads a schema and executes a tool; the REST one queues a call and fetches it."""
    toolserver = the_block("python", "/toolserver/")
    assert run_snippet(toolserver, demo_stack, readme_gateway.url).splitlines() == ["ticket_lookup", "open"]
    rest = the_block("python", "/v1/calls")
    assert run_snippet(rest, demo_stack, readme_gateway.url).splitlines() == ["202 pending", "200 0 Oslo"]


def test_desktop_client_config_runs_toolworker_mcp() -> None:
    """The desktop client entry is JSON that runs `toolworker mcp` with the settings it needs."""
    block = the_block("json", "mcpServers")
    entry = json.loads(block)["mcpServers"]["toolworker"]
    assert entry["command"].endswith("/toolworker") and entry["args"] == ["mcp"]
    assert set(entry["env"]) == {"TOOLWORKER_REDIS_URL", "TOOLWORKER_DEFINITIONS"}


@pytest.mark.integration
def test_python_client_example(demo_stack: str) -> None:
    """The ToolClient example calls, submits, batches and searches through a real worker."""
    block = the_block("python", "client.search(")
    lines = run_snippet(block, demo_stack).splitlines()
    assert lines[0].startswith("0 200 ")
    assert json.loads(lines[0].split(" ", 2)[2])["status"] == "open"
    assert json.loads(lines[1])["city"] == "Paris"
    assert lines[2:4] == ["ticket_lookup 0", "weather_current 0"]
    assert "ticket_create" in lines[4]


@pytest.mark.integration
def test_plain_redis_example(demo_stack: str) -> None:
    """Enqueuing with plain Redis commands (no Celery) gets the envelope on the reply stream."""
    block = the_block("python", "r.lpush")
    output = run_snippet(block, demo_stack)
    code, result = output.strip().split(" ", 1)
    assert code == "0"
    assert json.loads(result)["id"] == "TICKET-123"


@pytest.mark.integration
def test_tenant_examples(demo_stack: str, tmp_path: Path) -> None:
    """The tenants' client example runs, their limits load, and the other-language recipe is answered."""
    client = the_block("python", "TenantQueueFull")
    assert run_snippet(client, demo_stack).splitlines() == ["0"]
    recipe = the_block("python", "toolworker:tenants:ring:toolcalls")
    assert run_snippet(recipe, demo_stack).splitlines() == ["0"]
    [limits] = [b for b in code_blocks("yaml") if b.startswith("tenants:")]
    path = tmp_path / "tenants.yaml"
    path.write_text(limits, encoding="utf-8")
    toolset = load([path], environ={})
    assert toolset.problems == [] and toolset.tenants["live"].weight == 4


@pytest.mark.integration
@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=b.where) for b in blocks_of("python") if not any(marker in b.text for marker in CHECKED)],
)
def test_python_examples_run(block: Block, demo_stack: str, readme_gateway: Gateway) -> None:
    """Every other python block of the docs runs as written against the stack without raising."""
    run_snippet(block.text, demo_stack, readme_gateway.url, block.where)


@pytest.mark.integration
def test_getting_started_python_call(demo_stack: str) -> None:
    """The first call from Python, on the getting-started page, prints exit code 0."""
    block = the_block("python", 'print(client.call("ticket_lookup"')
    assert run_snippet(block, demo_stack).splitlines() == ["0"]


@pytest.mark.integration
def test_documented_commands_exist() -> None:
    """Every `toolworker` subcommand the docs show is one, and answers --help."""
    text = docs_text()
    choices = set(_subcommands())
    named = set(re.findall(r"`(?:\.venv/bin/)?toolworker ([a-z][\w-]*)", text))
    assert named <= choices, f"the docs name commands the CLI does not have: {named - choices}"
    pattern = r"toolworker (worker|call|tools|schema|validate|import-openapi|dev|gateway|mcp|audit|queue)\b"
    commands = set(re.findall(pattern, text)) | named
    expected = {"worker", "call", "tools", "schema", "validate", "import-openapi", "gateway", "mcp", "audit", "queue"}
    assert commands >= expected
    for command in sorted(commands):
        done = subprocess.run([sys.executable, "-m", "worker", command, "--help"], capture_output=True, timeout=60)
        assert done.returncode == 0, (command, done.stderr)


def test_documented_settings_exist() -> None:
    """Every TOOLWORKER_* variable the README or the docs name is a setting."""
    from worker.settings import Settings

    documented = set(re.findall(r"`TOOLWORKER_([A-Z_]+)", docs_text())) - {"UPSTREAM_"}
    fields = {name.upper() for name in Settings.model_fields}
    assert documented - {"UPSTREAM_<NAME>_URL"} <= fields, documented - fields
    assert {"REDIS_URL", "DEFINITIONS", "GATEWAY_ACCESS", "REDIS_MIN_REPLICAS"} <= documented


def test_settings_reference_lists_every_setting() -> None:
    """The settings reference, as the site's build writes it, lists every field of Settings with its default."""
    from scripts.docs_hooks import undocumented_settings
    from worker.settings import Settings

    page = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")
    built = page.replace("<!-- generated: settings -->", undocumented_settings(page))
    rows = dict(re.findall(r"^\| `TOOLWORKER_([A-Z0-9_]+)` \| ([^|]+) \|", built, re.MULTILINE))
    assert set(rows) == {name.upper() for name in Settings.model_fields}
    assert rows["GATEWAY_PORT"].strip() == "`8780`" and rows["GATEWAY_TOKENS"].strip() == "empty"


def test_exit_codes_reference_lists_every_error() -> None:
    """The exit codes reference has one row per code of worker/errors.py's tree, plus 0 and 22, and no other."""
    from worker import errors

    page = (ROOT / "docs" / "reference" / "exit-codes.md").read_text(encoding="utf-8")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", page, re.MULTILINE)}
    classes = [
        value for value in vars(errors).values() if isinstance(value, type) and issubclass(value, errors.ToolError)
    ]
    assert documented == {0, 22} | {cls.exit_code for cls in classes}


def test_docs_build_is_strict_and_in_make_test() -> None:
    """`make test` builds the site with `mkdocs build --strict`, without --quiet (under which mkdocs counts no
    warning, so a broken link would pass), and mkdocs.yml turns omitted pages and broken anchors into warnings."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    [docs] = re.findall(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert "mkdocs build --strict" in docs and "--quiet" not in docs and " -q" not in docs
    [test] = re.findall(r"^test:.*\n(?:\t.*\n)+", makefile, re.MULTILINE)
    assert re.search(r"\bdocs\b", test)
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"theme:\s*\n\s*name: material", config)
    for check in ("omitted_files", "anchors", "unrecognized_links"):
        assert re.search(rf"^\s*{check}: warn$", config, re.MULTILINE), check


def test_rest_and_cli_references_cover_the_code() -> None:
    """The REST reference names every operation of the gateway's OpenAPI document, and the CLI reference
    every `toolworker` command, as the site's build writes them."""
    from scripts.docs_hooks import cli_reference, openapi, rest_reference

    rest = rest_reference("")
    for path, methods in openapi()["paths"].items():
        for method, operation in methods.items():
            assert f"`{method.upper()} {path}`" in rest and f"`{operation['operationId']}`" in rest
    cli = cli_reference("")
    assert set(re.findall(r"^## toolworker (\S+)$", cli, re.MULTILINE)) == set(_subcommands())
    assert "usage: toolworker call" in cli


@pytest.mark.integration  # a definitions block runs `toolworker validate`
@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in blocks_of("yaml", "yml")])
def test_yaml_examples_are_valid(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every yaml block of the docs is a definitions file `toolworker validate` accepts, or a valid access file."""
    from worker.gateway.identity.principals import AccessFile, access_problems
    from worker.settings import Settings

    data = yaml.safe_load(block.text)
    assert isinstance(data, dict) and data, f"{block.where}: a yaml block holds a mapping"
    if set(data) <= set(AccessFile.model_fields):
        text = block.text
        for number, name in enumerate(sorted(set(re.findall(r"\$\{file:([^}]+)\}", text)))):
            secret = tmp_path / f"secret-{number}"
            secret.write_text("a-secret")
            text = text.replace(f"${{file:{name}}}", f"${{file:{secret}}}")
        for name in re.findall(r"\$\{env:(\w+)", text):
            monkeypatch.setenv(name, "a-secret")
        path = tmp_path / "access.yaml"
        path.write_text(text, encoding="utf-8")
        assert access_problems(Settings(gateway_access=path)) == [], block.where
        return
    path = tmp_path / "definitions.yaml"
    path.write_text(block.text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "worker", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")},
    )
    assert done.returncode == 0, f"{block.where}:\n{done.stderr}{done.stdout}"


def _subcommands() -> dict[str, object]:
    import argparse

    [action] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))


def shell_commands(block: Block) -> list[tuple[dict[str, str], list[str]]]:
    """(assignments, argv) of each line of a shell block, comments and `export` dropped."""
    found = []
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            words = words[1:]
        assignments = {}
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        if assignments or words:
            found.append((assignments, words))
    return found


@pytest.mark.integration
@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in blocks_of("sh", "bash", "shell")])
def test_shell_examples(block: Block, demo_stack: str) -> None:
    """Every line of the docs' shell blocks is a make target, a setting, or a `toolworker` command the CLI
    accepts; the commands that read local files or call through the queue run and exit 0."""
    from worker.settings import Settings

    fields = {name.upper() for name in Settings.model_fields}
    for assignments, argv in shell_commands(block):
        unknown = {
            n for n in assignments if n.startswith("TOOLWORKER_") and n.removeprefix("TOOLWORKER_") not in fields
        }
        assert not unknown, f"{block.where}: {unknown} are not settings"
        if not argv:
            continue
        if argv[0] == "make":
            assert set(argv[1:]) <= _make_targets(), f"{block.where}: {argv} names no Makefile target"
            continue
        assert Path(argv[0]).name == "toolworker", f"{block.where}: {argv[0]!r} is not a command the docs run"
        try:
            parser().parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{block.where}: `{shlex.join(argv)}` is refused by the CLI (exit {exc.code})")
        if argv[1] in RUNNABLE:
            env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
            env.update({k: v.replace(README_URL, demo_stack) for k, v in assignments.items()})
            env.setdefault("TOOLWORKER_REDIS_URL", demo_stack)
            command = [sys.executable, "-m", "worker", *argv[1:]]
            done = subprocess.run(command, capture_output=True, text=True, timeout=90, env=env, cwd=ROOT)
            assert done.returncode == 0, f"{block.where}: `{shlex.join(argv)}` exited {done.returncode}\n{done.stderr}"


@pytest.mark.integration
def test_first_call_prints_the_envelope(demo_stack: str) -> None:
    """The README's first call, run as written, prints an envelope like the one the README shows."""
    [command] = [b for b in blocks_of("sh") if b.page.name == "README.md" and "toolworker call" in b.text]
    [(assignments, argv)] = shell_commands(command)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWORKER_")}
    env.update({k: v.replace(README_URL, demo_stack) for k, v in assignments.items()})
    done = subprocess.run(
        [sys.executable, "-m", "worker", *argv[1:]], capture_output=True, text=True, timeout=90, env=env
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(the_block_in("README.md", "json", '"callId"'))
    printed = json.loads(done.stdout)
    assert set(printed) == set(shown)
    assert (printed["statusCode"], printed["exitCode"], printed["headers"]) == (200, 0, shown["headers"])
    assert json.loads(printed["result"]) == json.loads(shown["result"])


def the_block_in(page_name: str, language: str, marker: str) -> str:
    [block] = [b for b in blocks_of(language) if b.page.name == page_name and marker in b.text]
    return block.text


def test_readme_is_a_first_screen() -> None:
    """The README stays short (at most 250 lines), has the Quickstart, the picture of a call and the first
    call, and each of its relative links names a file of the repository."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "\n## Quickstart\n" in readme and "make run" in readme and "make test" in readme
    assert any("orchestrator ──ToolCall──▶" in b.text for b in BLOCKS if b.page.name == "README.md" and not b.language)
    links = re.findall(r"\]\(((?!https?://)[^)#]+)(?:#[^)]*)?\)", readme)
    assert any(link.startswith("docs/") for link in links)
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_native_yaml_example_loads(tmp_path: Path) -> None:
    """The native-format example of the definitions guide is a valid definitions file."""
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
    """The definitions guide's authentication example is a valid definitions file, one upstream per auth type."""
    from worker.definitions import file_store

    [block] = [b for b in code_blocks("yaml") if "oauth2_client_credentials" in b and "per_call_header" in b]
    path = tmp_path / "auth.yaml"
    path.write_text(block)
    toolset = file_store.load([path], {})
    assert toolset.problems == []
    kinds = {name: upstream.auth.type for name, upstream in toolset.upstreams.items() if upstream.auth}
    assert sorted(kinds.values()) == ["api_key", "basic", "bearer", "bearer", "oauth2_client_credentials"]


def test_access_file_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity guide's access file is valid: its tokens resolve, its scopes grant, its audience is as written."""
    from worker.gateway.identity.principals import access_problems, load_access
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
