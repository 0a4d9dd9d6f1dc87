"""docker-compose.yml and the Dockerfile, checked without a Docker engine: every command, name and port is real."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.cli import parser
from worker.connections import parse_sentinel_url
from worker.queue.app import app
from worker.settings import Settings

ROOT = Path(__file__).parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
OUR_SERVICES = ("worker", "flower", "demo", "gateway")
TOOLWORKER = str(Path(sys.executable).parent / "toolworker")
_VARIABLE = re.compile(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}` (an unset required variable is an error)."""

    def replace(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if env.get(name):
            return env[name]
        if kind == ":?":
            raise KeyError(f"{name}: {rest}")
        return rest if kind == ":-" else ""

    return _VARIABLE.sub(replace, text)


def seconds(duration: str) -> float:
    """A compose duration (`1m30s`, `60s`) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = _DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def image_default(instruction: str) -> list[str]:
    """The final stage's ENTRYPOINT or CMD, which must be in exec (JSON) form."""
    values = [args for name, args in dockerfile_instructions() if name == instruction]
    assert values, f"the Dockerfile has no {instruction}"
    parsed: list[str] = json.loads(values[-1])
    return parsed


def argv(service: str) -> list[str]:
    """What a service's container runs: entrypoint + command, with the image's defaults where it has them."""
    spec = SERVICES[service]
    if service not in OUR_SERVICES:
        return list(spec["command"])
    if "entrypoint" in spec:  # compose: a new entrypoint also drops the image's CMD
        return [*spec["entrypoint"], *spec.get("command", [])]
    return [*image_default("ENTRYPOINT"), *spec.get("command", image_default("CMD"))]


def healthcheck(service: str) -> list[str]:
    test = SERVICES[service]["healthcheck"]["test"]
    assert test[0] == "CMD", f"{service}: an exec-form healthcheck, no shell"
    return list(test[1:])


def options(args: list[str]) -> dict[str, str]:
    """`--name=value` and bare `--flag` arguments, by name with `-` as `_`."""
    found = {}
    for arg in args:
        name, equals, value = arg.removeprefix("--").partition("=")
        found[name.replace("-", "_")] = value if equals else "true"
    return found


def container_port(mapping: str) -> tuple[str | None, int]:
    """(host part, container port) of a short-syntax `ports` entry."""
    host, _, container = interpolate(mapping, {}).rpartition(":")
    return host or None, int(container.partition("/")[0])


def definitions_env_names() -> set[str]:
    """Names that the mounted definitions read with `${env:NAME}`."""
    text = " ".join(p.read_text() for p in (ROOT / "definitions").rglob("*") if p.suffix in {".yaml", ".yml", ".json"})
    return set(re.findall(r"\$\{env:(\w+)", text))


def run_help(command: list[str]) -> None:
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60, env=_clean_env())
    assert done.returncode == 0, f"{command} --help failed:\n{done.stderr[-2000:]}"
    assert "usage" in done.stdout.lower()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TOOLWORKER_", "FLOWER_"))}


def _toolworker_commands() -> list[Any]:
    worker = argv("worker")
    health = healthcheck("worker")
    return [pytest.param(worker, id="worker-command"), pytest.param(health, id="worker-healthcheck")]


def test_dockerfile_runs_toolworker() -> None:
    """The image's entrypoint is the `toolworker` script that the package installs; its default is a worker."""
    assert image_default("ENTRYPOINT") == ["toolworker"]
    assert image_default("CMD") == ["worker"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["toolworker"] == "worker.cli:main"


def test_dockerfile_copies_files_that_exist_and_are_not_ignored() -> None:
    """Every COPY source exists in the repository and .dockerignore does not hide it."""
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    ignored = [pattern for pattern in ignored if pattern and not pattern.startswith("#")]
    sources = []
    for name, args in dockerfile_instructions():
        if name == "COPY" and "--from=" not in args:
            sources += args.split()[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source


def test_our_services_build_one_image() -> None:
    """worker, flower, demo and gateway run the image built from the Dockerfile."""
    assert {SERVICES[name]["build"] for name in OUR_SERVICES} == {"."}
    assert len({SERVICES[name]["image"] for name in OUR_SERVICES}) == 1


@pytest.mark.integration
@pytest.mark.parametrize("command", _toolworker_commands())
def test_toolworker_commands_exist(command: list[str]) -> None:
    """The worker's command and healthcheck are `toolworker` subcommands with options the CLI accepts."""
    assert command[0] == "toolworker"
    run_help([TOOLWORKER, command[1]])
    try:
        parser().parse_args(command[1:])
    except SystemExit as exc:
        pytest.fail(f"`{' '.join(command)}` is refused by the CLI (exit {exc.code})")


@pytest.mark.integration
def test_flower_command_and_options_are_real() -> None:
    """Flower starts from our app; every option and FLOWER_* variable is one Flower knows (it drops unknown ones)."""
    from flower.command import is_flower_envvar
    from flower.options import default_options

    command = argv("flower")
    assert command[:4] == ["celery", "-A", "worker.app", "flower"]
    run_help([sys.executable, "-m", "celery", "-A", "worker.app", "flower"])
    flags = options(command[4:])
    assert all(name in default_options for name in flags), flags
    assert flags["read_only"] == "true" and flags["address"] == "0.0.0.0"
    environment = SERVICES["flower"]["environment"]
    assert all(is_flower_envvar(name) for name in environment if name.startswith("FLOWER_"))
    assert "basic_auth" not in flags, "credentials belong in FLOWER_BASIC_AUTH, not on the command line"
    with pytest.raises(KeyError):
        interpolate(environment["FLOWER_BASIC_AUTH"], {})  # Flower never starts without credentials
    assert interpolate(environment["FLOWER_BASIC_AUTH"], {"FLOWER_BASIC_AUTH": "a:b"}) == "a:b"


def test_flower_ports_and_healthcheck_agree() -> None:
    """Flower's published port is its --port, and its healthcheck asks that port's /healthcheck."""
    from flower.urls import handlers

    port = int(options(argv("flower")[4:])["port"])
    assert [container_port(p)[1] for p in SERVICES["flower"]["ports"]] == [port]
    check = healthcheck("flower")
    assert check[:2] == ["python", "-c"]
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", check[2])
    assert url is not None and int(url.group(1)) == port
    assert any(handler[0] == url.group(2) for handler in handlers if isinstance(handler, tuple))
    compile(check[2], "<healthcheck>", "exec")


def test_demo_upstream_matches_the_worker() -> None:
    """The demo service runs worker.dev.demo.serve on the port that the worker's TOOLWORKER_DEMO_URL names."""
    from worker.dev.demo import serve

    assert callable(serve)
    demo = SERVICES["demo"]
    assert demo["profiles"] == ["demo"]
    command = argv("demo")
    assert command[:2] == ["python", "-c"]
    calls = [node for node in ast.walk(ast.parse(command[2])) if isinstance(node, ast.Call)]
    assert len(calls) == 1 and ast.unparse(calls[0].func) == "serve"
    host, port = (ast.literal_eval(arg) for arg in calls[0].args)
    assert host == "0.0.0.0" and str(port) in demo["expose"]
    assert SERVICES["worker"]["environment"]["TOOLWORKER_DEMO_URL"] == f"http://demo:{port}"


def test_toolworker_variables_are_settings() -> None:
    """Every TOOLWORKER_* variable is a Settings field (or a variable that the mounted definitions read)."""
    fields = {f"TOOLWORKER_{name.upper()}" for name in Settings.model_fields}
    known = fields | definitions_env_names()
    used = {
        name for spec in SERVICES.values() for name in spec.get("environment", {}) if name.startswith("TOOLWORKER_")
    }
    assert used and used <= known, sorted(used - known)
    assert "TOOLWORKER_DEMO_URL" in definitions_env_names()


def test_worker_scales_and_stops_cleanly() -> None:
    """The worker has no fixed name or host port, has a healthcheck, and gets longer than its soft shutdown."""
    worker = SERVICES["worker"]
    assert "container_name" not in worker
    assert all(container_port(p)[0] is None for p in worker.get("ports", []))
    assert worker["healthcheck"]["test"]
    assert seconds(worker["stop_grace_period"]) > app.conf.worker_soft_shutdown_timeout
    check = healthcheck("worker")
    assert seconds(worker["healthcheck"]["timeout"]) > float(check[check.index("--timeout") + 1])
    environment = worker["environment"]
    assert interpolate(environment["TOOLWORKER_REDIS_URL"], {}) == "redis://redis:6379/0"
    assert f"./definitions:{environment['TOOLWORKER_DEFINITIONS']}:ro" in worker["volumes"]
    if "metrics_port" in Settings.model_fields:
        assert str(Settings.model_fields["metrics_port"].default) in worker["expose"]


def test_redis_is_durable_and_checked() -> None:
    """Redis keeps an AOF, never evicts, answers a healthcheck, and the services wait for it."""
    redis = SERVICES["redis"]
    flags = dict(zip(redis["command"][1::2], redis["command"][2::2], strict=True))
    assert redis["command"][0] == "redis-server"
    assert flags["--appendonly"] == "yes" and flags["--maxmemory-policy"] == "noeviction"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name in ("worker", "flower"):
        assert SERVICES[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert interpolate(SERVICES[name]["environment"]["TOOLWORKER_REDIS_URL"], {}).startswith("redis://redis:6379/")


def test_gateway_scales_needs_tokens_and_checks_its_health() -> None:
    """The gateway runs on the port it publishes (a range: replicas scale), needs tokens, checks /healthz."""
    gateway = SERVICES["gateway"]
    command = argv("gateway")
    assert command[:2] == ["toolworker", "gateway"]
    parsed = parser().parse_args(command[1:])
    assert parsed.host == "0.0.0.0"
    [mapping] = gateway["ports"]
    host, port = container_port(mapping)
    assert port == parsed.port and host is not None and host.startswith("127.0.0.1:") and "-" in host
    with pytest.raises(KeyError):
        interpolate(gateway["environment"]["TOOLWORKER_GATEWAY_TOKENS"], {})
    check = healthcheck("gateway")
    assert check[:2] == ["python", "-c"] and f"http://127.0.0.1:{port}/healthz" in check[2]
    compile(check[2], "<healthcheck>", "exec")
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "container_name" not in gateway


def test_the_ha_profile_has_a_replica_and_three_sentinels_the_services_can_use() -> None:
    """`--profile ha`: a replica of `redis`, three Sentinels watching it (quorum 2), and a Sentinel URL that
    every service takes from TOOLWORKER_REDIS_URL and that names those three."""
    replica, sentinels = SERVICES["redis-replica"], [SERVICES[f"sentinel-{i}"] for i in (1, 2, 3)]
    assert replica["profiles"] == ["ha"] and all(s["profiles"] == ["ha"] for s in sentinels)
    assert replica["command"][:4] == ["redis-server", "--replicaof", "redis", "6379"]
    assert all("sentinel monitor mymaster redis 6379 2" in s["command"][0] for s in sentinels)
    url = "sentinel://sentinel-1:26379;sentinel://sentinel-2:26379;sentinel://sentinel-3:26379/0"
    assert parse_sentinel_url(url).nodes == tuple((f"sentinel-{i}", 26379) for i in (1, 2, 3))
    assert url in (ROOT / "docker-compose.yml").read_text()
    for name in ("worker", "flower", "gateway"):
        environment = SERVICES[name]["environment"]
        assert interpolate(environment["TOOLWORKER_REDIS_URL"], {"TOOLWORKER_REDIS_URL": url}) == url
