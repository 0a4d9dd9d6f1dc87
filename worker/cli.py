"""The `toolworker` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worker.connections import RedisUnavailable, check_reachable, sync_client
from worker.constants import DEFAULT_QUEUE
from worker.errors import RedisLost
from worker.redaction import mask_url
from worker.settings import Settings, get_settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except (RedisUnavailable, RedisLost) as exc:  # EX_UNAVAILABLE, the reason on one line, no traceback
        print(f"toolworker: {exc}", file=sys.stderr)
        return 69
    except ValidationError as exc:  # EX_CONFIG: a TOOLWORKER_* setting the settings refuse (never its value)
        for error in exc.errors(include_input=False):
            where = "".join(f"TOOLWORKER_{str(part).upper()}: " for part in error["loc"][:1])
            message = error["msg"].removeprefix("Value error, ")
            print(f"toolworker: invalid setting: {where}{message}", file=sys.stderr)
        return 78
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolworker", description="Execute LLM agents' HTTP tool calls.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    worker = commands.add_parser("worker", help="run a worker (extra arguments go to `celery worker`)")
    worker.add_argument("-c", "--concurrency", type=int, help="pool size (TOOLWORKER_CONCURRENCY)")
    worker.add_argument(
        "-P",
        "--pool",
        choices=["threads", "prefork", "solo"],
        default="threads",
        help="threads: calls on the event loop",
    )
    worker.add_argument("-Q", "--queues", help="comma-separated queues to consume (default: toolcalls)")
    worker.add_argument("-n", "--hostname", help="worker node name")
    worker.add_argument("--processes", type=int, help="worker processes, one core each (TOOLWORKER_PROCESSES)")
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(handler=_worker)

    dev = commands.add_parser("dev", help="the local stack: Redis-compatible server, demo upstream, worker, Flower")
    dev.add_argument("--flower-port", type=int, default=5555)
    dev.set_defaults(handler=_dev)

    call = commands.add_parser("call", help="call a tool and print its envelope; exits with its exitCode")
    call.add_argument("tool")
    call.add_argument("--arg", action="append", default=[], metavar="K=V", help="an argument (V parsed as JSON)")
    call.add_argument("--args", metavar="JSON", help="all arguments as a JSON object")
    call.add_argument("--header", action="append", default=[], metavar="K:V", help="a per-call header")
    call.add_argument("--timeout", type=float, default=60.0, metavar="S")
    call.add_argument("--no-wait", action="store_true", help="print the callId and exit")
    call.set_defaults(handler=_call)

    tools = commands.add_parser("tools", help="list (or search) the tools of the definitions store")
    tools.add_argument("--tag", action="append", default=[], help="only tools with this tag (repeatable)")
    tools.add_argument("--search", metavar="Q", help="the tools that best match a question")
    tools.add_argument("--top-k", type=int, default=5, metavar="N")
    tools.add_argument("--format", choices=["table", "json", "openai", "anthropic", "mcp"], default="table")
    tools.set_defaults(handler=_tools)

    imports = commands.add_parser("import-openapi", help="turn an OpenAPI 3.x / Swagger 2.0 spec into definitions")
    imports.add_argument("spec", type=Path)
    imports.add_argument("--upstream", required=True, help="the upstream name the tools will use")
    imports.add_argument("--base-url", help="the upstream's base URL (default: the spec's servers)")
    imports.add_argument("--tag", action="append", default=[], help="only operations with this tag (repeatable)")
    imports.add_argument("-o", "--output", type=Path, help="write here instead of standard output")
    imports.set_defaults(handler=_import_openapi)

    schema = commands.add_parser("schema", help="print a tool's full definition")
    schema.add_argument("tool")
    schema.set_defaults(handler=_schema)

    health = commands.add_parser("health", help="exit 0 when a worker answers a ping through the broker, else 1")
    health.add_argument("--node", help="the worker node that must answer (%%h: this host's name), e.g. celery@%%h")
    health.add_argument("--timeout", type=float, default=5.0, metavar="S")
    health.set_defaults(handler=_health)

    publish = commands.add_parser("publish", help="check definitions and make them the version workers serve")
    publish.add_argument("paths", nargs="*", type=Path)
    publish.set_defaults(handler=_publish)

    gateway = commands.add_parser("gateway", help="the agent gateway over HTTP: MCP at /mcp, /toolserver, /v1")
    gateway.add_argument("--host", help="address to listen on (TOOLWORKER_GATEWAY_HOST; loopback without tokens)")
    gateway.add_argument("--port", type=int, help="port (TOOLWORKER_GATEWAY_PORT)")
    _gateway_options(gateway)
    gateway.set_defaults(handler=_gateway)

    mcp = commands.add_parser("mcp", help="the agent gateway as an MCP server on stdio (desktop MCP clients)")
    _gateway_options(mcp)
    mcp.set_defaults(handler=_mcp)

    queue = commands.add_parser("queue", help="calls waiting and in flight, per queue and tenant")
    queue.add_argument("-Q", "--queues", help="comma-separated queues (default: toolcalls and every routed queue)")
    queue.add_argument("--format", choices=["table", "json"], default="table")
    queue.set_defaults(handler=_queue)

    shards = commands.add_parser("shards", help="the shards of TOOLWORKER_REDIS_SHARDS, or the one a tenant lives on")
    shards.add_argument("--tenant", metavar="T", help="print only the shard of tenant T")
    shards.set_defaults(handler=_shards)

    validate = commands.add_parser("validate", help="check definitions; lists every problem, non-zero on any")
    validate.add_argument("paths", nargs="*", type=Path)
    validate.set_defaults(handler=_validate)

    for register in _COMMANDS:
        register(commands)
    return parser


def _audit_command(commands: Any) -> None:
    audit = commands.add_parser("audit", help="the gateway's audit trail: one JSON line per call it took")
    audit.add_argument("--principal", metavar="P", help="only this principal's calls")
    audit.add_argument("--since", metavar="T", help="from this time on: ISO 8601, or an age like 15m, 2h, 7d")
    audit.set_defaults(handler=_audit)


def _dead_letters_command(commands: Any) -> None:
    letters = commands.add_parser("dead-letters", help="messages the workers refused: list, show, replay, purge")
    letters.add_argument("--shard", metavar="S", help="with shards: the shard whose items (default: the first)")
    actions = letters.add_subparsers(required=True, metavar="ACTION")
    actions.add_parser("list", help="one line per item: its N (a stable id) and reason").set_defaults(action="list")
    for name, text in _DEAD_LETTER_ACTIONS.items():
        one = actions.add_parser(name, help=text)
        one.add_argument("item", metavar="N", help="the item's id, as `dead-letters list` prints it")
        one.set_defaults(action=name)
        if name == "purge":
            one.add_argument("--yes", action="store_true", help="accepted for scripts (purge never asks)")
    letters.set_defaults(handler=_dead_letters)


_DEAD_LETTER_ACTIONS = {
    "show": "print that item only, redacted (header names kept, values never stored)",
    "replay": "enqueue the item's calls again with their callIds (each answered once)",
    "purge": "remove exactly that item",
}


def _approvals_parser(commands: Any) -> None:
    """`toolworker approvals list|approve ID|deny ID --reason R`: the calls parked for a human's approval."""
    approvals = commands.add_parser("approvals", help="calls parked for a human's approval: list, approve, deny")
    actions = approvals.add_subparsers(required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the calls waiting for a decision, one line each, callId first")
    listing.add_argument("--format", choices=["lines", "json"], default="lines")
    listing.set_defaults(handler=_approvals_list)
    for decision, text in (("approve", "approve a parked call: it runs once"), ("deny", "deny it: answered 77")):
        action = actions.add_parser(decision, help=text)
        action.add_argument("call_id", metavar="ID")
        action.add_argument("--reason", default="", metavar="R", help="why (in the audit trail; a denial's envelope)")
        action.set_defaults(handler=_approvals_decide, decision=decision)


def _connections_parser(commands: Any) -> None:
    connections = commands.add_parser("connections", help="end users' connections to upstreams that act for them")
    actions = connections.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="a user's connections: upstream, scopes, expiry (never a token)")
    listing.add_argument("--user", required=True, metavar="U")
    revoke = actions.add_parser("revoke", help="revoke a user's grant at the authorization server and remove it")
    revoke.add_argument("--user", required=True, metavar="U")
    revoke.add_argument("--upstream", required=True, metavar="X")
    connections.set_defaults(handler=_connections)


_MAX_RESTARTS = 5


# Set for the processes a supervisor starts, and for a worker restarting itself in place: they retry a
# Redis that went away (recovery) instead of failing fast as a start with bad settings does.
_RESTARTS_ENV = "TOOLWORKER_RESTARTS"


def _check_redis(settings: Settings) -> None:
    """Fail fast, saying why, when the settings cannot work (wrong password, nothing listening)."""
    check_reachable(settings.redis_url, settings.redis_connect_timeout_seconds)


def _queue_gauges(settings: Settings, queues: str | None) -> list[Any]:
    """The queue depth and in-flight gauges of the queues this worker consumes."""

    from worker.queue.depth import QueueDepth

    client = sync_client(settings.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    return [QueueDepth(client, [q.strip() for q in (queues or DEFAULT_QUEUE).split(",") if q.strip()])]


def _worker(args: argparse.Namespace) -> int:
    from worker.logs import configure

    settings = get_settings()
    configure(settings.log_format, settings.log_level)
    if not _vault_keys_usable(settings):
        return 78
    concurrency = args.concurrency or settings.concurrency
    processes = args.processes or settings.processes
    from worker.queue.supervisor import SUPERVISED_ENV

    if not (os.environ.get(_RESTARTS_ENV) or os.environ.get(SUPERVISED_ENV)):
        _check_redis(settings)
    shards = [shard.name for shard in settings.shards.all] if settings.shards.sharded and not settings.shard else [""]
    if processes > 1 or len(shards) > 1:
        from worker.queue.supervisor import supervise

        child = ["-P", args.pool, "-c", str(concurrency), "--loglevel", args.loglevel, "--processes", "1"]
        child += ["-Q", args.queues] if args.queues else []
        gauges = _queue_gauges(settings, args.queues)
        return supervise(child, processes, args.hostname, settings.metrics_port, gauges, shards)
    from worker.queue.app import app

    argv = ["worker", "-c", str(concurrency), "--loglevel", args.loglevel]
    if args.pool != "threads":  # threads: the app's own pool (worker_pool), calls on the event loop
        app.conf.worker_pool = args.pool  # Celery would take the app's pool for `-P prefork` otherwise
        argv += ["-P", args.pool]
    # Workers need neither gossip nor mingle (no elections, no shared revokes): both only add broker
    # traffic, a second of start-up, and reconnect paths of their own.
    argv += ["-Q", args.queues or DEFAULT_QUEUE, "--without-gossip", "--without-mingle"]
    if args.hostname:
        argv += ["-n", args.hostname]
    from worker.metrics import start_metrics_server

    start_metrics_server(settings.metrics_port, collectors=_queue_gauges(settings, args.queues))
    try:
        app.worker_main(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            _restart_in_place(exc.code)
        raise
    return 0


def _restart_in_place(code: object) -> None:
    """After an unrecoverable broker error (kombu can fail this way when Redis restarts), start afresh
    in the same process, so the worker reconnects by itself and keeps its pid; give up after a few tries."""
    restarts = int(os.environ.get(_RESTARTS_ENV, "0"))
    if restarts >= _MAX_RESTARTS:
        print(f"toolworker: the worker stopped with {code}; not restarting again", file=sys.stderr)
        return
    print(f"toolworker: the worker stopped with {code}; restarting", file=sys.stderr, flush=True)
    time.sleep(min(30.0, 2.0**restarts))
    os.environ[_RESTARTS_ENV] = str(restarts + 1)
    os.execv(sys.executable, [sys.executable, "-m", "worker", *sys.argv[1:]])


def _dev(args: argparse.Namespace) -> int:
    from worker.dev.stack import run_dev_stack

    return run_dev_stack(flower_port=args.flower_port)


def _call(args: argparse.Namespace) -> int:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from worker.client import ToolClient

    arguments = _parse_arguments(args.args, args.arg)
    headers = dict(_split(h, ":", "--header") for h in args.header)
    settings = get_settings()
    _check_redis(settings)
    try:
        with ToolClient() as client:
            if args.no_wait:
                print(client.submit(args.tool, arguments, headers=headers, timeout=args.timeout).call_id)
                return 0
            result = client.call(args.tool, arguments, headers=headers, timeout=args.timeout)
    except RedisConnectionError as exc:  # Redis went away after the check
        raise RedisUnavailable(f"lost Redis at {mask_url(settings.redis_url)}: {exc}") from None
    print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    return result.exit_code


def _parse_arguments(args_json: str | None, pairs: list[str]) -> dict[str, Any]:
    arguments: dict[str, Any] = json.loads(args_json) if args_json else {}
    if not isinstance(arguments, dict):
        raise SystemExit("toolworker: --args must be a JSON object")
    for pair in pairs:
        key, raw = _split(pair, "=", "--arg")
        try:
            arguments[key] = json.loads(raw)
        except ValueError:
            arguments[key] = raw  # a bare word is a string
    return arguments


def _split(text: str, sep: str, option: str) -> tuple[str, str]:
    key, found, value = text.partition(sep)
    if not found or not key.strip():
        raise SystemExit(f"toolworker: {option} takes NAME{sep}VALUE, got {text!r}")
    return key.strip(), value.strip() if sep == ":" else value


def _progress(text: str) -> None:
    print(f"toolworker: {text}...", file=sys.stderr, flush=True)


def _load_toolset(paths: list[Path]) -> Any:
    """The definitions as a worker serves them (built-in catalog tools included) when no path is given."""
    from worker.definitions import file_store
    from worker.definitions.builtin import served_toolset
    from worker.http.egress import EgressPolicy

    if paths:
        return file_store.load(paths)
    settings = get_settings()
    return served_toolset(file_store.load([settings.definitions]), EgressPolicy.parse(settings.egress_allow).enabled)


def _tools(args: argparse.Namespace) -> int:
    from worker.definitions import catalog

    toolset = _load_toolset([])
    rows = catalog.search(toolset, args.search, args.top_k) if args.search else catalog.list_tools(toolset, args.tag)
    exports = {"openai": catalog.to_openai, "anthropic": catalog.to_anthropic, "mcp": catalog.to_mcp}
    if args.format in exports:
        tools = [toolset.tools[row["name"]] for row in rows]  # the tools themselves: their kind sets MCP hints
        print(json.dumps(exports[args.format](tools), indent=2, ensure_ascii=False))
    elif args.format == "json":
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        _print_table(rows, ["name", "method", "path", "upstream", "summary"])
    return 0


def _import_openapi(args: argparse.Namespace) -> int:
    import yaml

    from worker.definitions.model import Problem
    from worker.definitions.readers.openapi import SpecError, import_openapi

    problems: list[Problem] = []
    _progress(f"reading {args.spec} ({args.spec.stat().st_size // 1024} KiB) and building every input schema")
    try:
        document = import_openapi(args.spec, args.upstream, args.base_url, args.tag, problems=problems)
    except SpecError as exc:
        print(f"toolworker: {exc.problem}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"skipped: {problem}", file=sys.stderr)
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=120)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
        print(f"{len(document['tools'])} tools written to {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: min(48, max([len(c), *(len(str(r[c])) for r in rows)])) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_cell(str(row[c]), widths[c]) for c in columns))


def _cell(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"


def _schema(args: argparse.Namespace) -> int:
    from worker.definitions import catalog

    found = catalog.schemas(_load_toolset([]), [args.tool])
    if found["missing"]:
        print(f"toolworker: no tool named {args.tool!r}", file=sys.stderr)
        return 64
    print(json.dumps(found["tools"][0], indent=2, ensure_ascii=False))
    return 0


def _health(args: argparse.Namespace) -> int:
    from worker.queue.health import check

    healthy, message = check(get_settings().redis_url, args.timeout, args.node)
    print(message, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


def _publish(args: argparse.Namespace) -> int:
    import redis

    from worker.definitions import file_store, redis_store

    settings = get_settings()
    paths = args.paths or [settings.definitions]
    _progress(f"checking {len(file_store.definition_files(paths))} definitions files")
    _check_redis(settings)
    client = sync_client(settings.redis_url)
    try:
        version, toolset = redis_store.publish(client, paths)
    except redis.ConnectionError as exc:  # Redis went away after the check
        raise RedisUnavailable(f"lost Redis at {mask_url(settings.redis_url)}: {exc}") from None
    finally:
        client.close()
    for problem in toolset.problems:
        print(problem, file=sys.stderr)
    if not version:
        print(f"not published: {len(toolset.problems)} problems; the current version is unchanged", file=sys.stderr)
        return 1
    print(f"published version {version}: {len(toolset.tools)} tools, {len(toolset.upstreams)} upstreams")
    return 0


def _gateway_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tag", action="append", default=[], help="offer only tools with this tag (repeatable)")
    parser.add_argument("--mode", choices=["all", "discovery"], default="all", help="discovery: meta-tools only")


def _gateway(args: argparse.Namespace) -> int:
    from worker.gateway.app import serve
    from worker.gateway.mcp.server import Options
    from worker.logs import configure

    settings = get_settings()
    configure(settings.log_format, settings.log_level)
    if not _vault_keys_usable(settings):
        return 78
    return serve(settings, Options(args.tag, args.mode), args.host, args.port)


def _vault_keys_usable(settings: Settings) -> bool:
    """TOOLWORKER_VAULT_KEYS parses (or is empty); else says why, on stderr."""
    from worker.call.vault import Keyring, VaultKeyError

    try:
        Keyring.parse(settings.vault_keys.get_secret_value())
    except VaultKeyError as exc:
        print(f"toolworker: {exc}", file=sys.stderr)
        return False
    return True


def _mcp(args: argparse.Namespace) -> int:
    from worker.gateway.mcp.server import Options
    from worker.gateway.mcp.stdio import serve_stdio
    from worker.logs import configure

    settings = get_settings()
    configure(settings.log_format, settings.log_level)
    if not _vault_keys_usable(settings):
        return 78
    return serve_stdio(settings, Options(args.tag, args.mode))


def _queue(args: argparse.Namespace) -> int:
    """`toolworker queue`: what waits and what runs, per queue and tenant (and shard), read from Redis. A
    shard that does not answer is named on stderr, the others are shown, and the exit status is 1."""
    from worker.queue.depth import shard_rows

    settings = get_settings()
    _check_redis(settings)  # the home shard: the routes are there
    queues = [q.strip() for q in (args.queues or "").split(",") if q.strip()]
    options: dict[str, Any] = {"socket_connect_timeout": 2.0, "socket_timeout": 5.0, "retry": None}
    clients = [(shard, sync_client(shard.url, **options)) for shard in settings.shards.all]
    try:
        rows, problems = shard_rows(clients, queues)
    finally:
        for _, client in clients:
            client.close()
    for problem in problems:
        print(f"toolworker queue: {problem}", file=sys.stderr)
    columns = ["queue", "tenant", "waiting", "queued", "in_flight"]
    if not settings.shards.sharded:
        rows = [{k: v for k, v in row.items() if k != "shard"} for row in rows]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows, ["shard", *columns] if settings.shards.sharded else columns)
        print("waiting: messages in the tenant's lists; queued: calls counted at enqueue; in_flight: calls running")
    return 1 if problems else 0


def _shards(args: argparse.Namespace) -> int:
    """`toolworker shards`: each shard (the home one first), or `--tenant T`: the shard T's calls go to."""
    shards = get_settings().shards
    if args.tenant is not None:
        from worker.client import checked_tenant

        shard = shards.of(checked_tenant(args.tenant))
        print(f"{shard.name or '-'}  {shard.where}")
        return 0
    for shard in shards.all:
        print(f"{shard.name or '-'}  {shard.where}{'  (home)' if shard is shards.home and shards.sharded else ''}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from worker.definitions.file_store import unset_settings

    toolset = _load_toolset(args.paths)
    for problem in toolset.problems:
        print(problem, file=sys.stderr)
    for unset in unset_settings(toolset, os.environ):
        print(f"unset: {unset}", file=sys.stderr)
    count = len(toolset.problems) + _access_problems()
    tenants = f", {len(toolset.tenants)} tenants" if toolset.tenants else ""
    summary = (
        f"{len(toolset.tools)} tools, {len(toolset.upstreams)} upstreams{tenants}, {count} problem{'s' * (count != 1)}"
    )
    print(summary)
    return 1 if count else 0


def _access_problems() -> int:
    """The gateway's access file (TOOLWORKER_GATEWAY_ACCESS), when there is one: its problems, printed."""
    from worker.gateway.identity.principals import access_problems

    problems = access_problems(get_settings())
    for problem in problems:
        print(problem, file=sys.stderr)
    return len(problems)


def _audit(args: argparse.Namespace) -> int:

    from worker.gateway.identity import audit

    settings = get_settings()
    try:
        start_ms = audit.since_ms(args.since) if args.since else 0
    except ValueError as exc:
        print(f"toolworker audit: {exc}", file=sys.stderr)
        return 64
    _check_redis(settings)
    client = sync_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
    try:
        for record in audit.read(client, args.principal, start_ms):
            print(json.dumps(record, ensure_ascii=False))
    finally:
        client.close()
    return 0


def _connections(args: argparse.Namespace) -> int:
    import asyncio

    from worker.gateway.rest.connections import run_command

    settings = get_settings()
    _check_redis(settings)
    toolset = _load_toolset([]) if args.action == "revoke" else None
    code, lines = asyncio.run(run_command(settings, args.action, args.user, getattr(args, "upstream", None), toolset))
    for line in lines:
        print(line, file=sys.stdout if code == 0 else sys.stderr)
    return code


def _dead_letters(args: argparse.Namespace) -> int:
    import asyncio

    settings = get_settings()
    try:  # items stay on the shard they were found on
        url = settings.shards.named(args.shard).url if args.shard else settings.redis_url
    except ValueError as exc:
        raise SystemExit(f"toolworker dead-letters: {exc}") from None
    _check_redis(settings)
    return asyncio.run(_dead_letters_async(settings, url, args.action, getattr(args, "item", "")))


async def _dead_letters_async(settings: Settings, url: str, action: str, item: str) -> int:
    from worker.connections import async_client
    from worker.queue.dead_letter_store import DeadLetterError, DeadLetters

    redis = async_client(url, socket_connect_timeout=5, socket_timeout=30)
    letters = DeadLetters(redis)
    try:
        if action == "list":
            for letter in await letters.items():
                print(f"{letter.id}  {letter.when}  {letter.reason}")
            return 0
        if action == "show":
            print(json.dumps((await letters.get(item)).shown(), indent=2, ensure_ascii=False, default=str))
            return 0
        done = await _dead_letter_change(settings, letters, action, item)
        print(f"{action} {item}: {done}")
        _audit_action(settings, f"dead_letter.{action}", item)
        return 0
    except DeadLetterError as exc:
        print(f"toolworker dead-letters: {exc}", file=sys.stderr)
        return 1
    finally:
        await redis.aclose()


async def _dead_letter_change(settings: Settings, letters: Any, action: str, item: str) -> str:
    """Purge or replay one item (a replay enqueues with a client of its own)."""
    if action == "purge":
        await letters.purge(item)
        return "purged"
    from worker.client import AsyncToolClient

    client = AsyncToolClient()

    async def enqueue(tool: str, arguments: Any, call_id: str, tenant: str, who: str | None, timeout_s: float) -> None:
        await client.submit_many(
            [(tool, arguments, {})], timeout=timeout_s, call_ids=[call_id], tenant=tenant, principal=who
        )

    try:
        done: str = await letters.replay(item, enqueue)
    finally:
        await client.aclose()
    return done


def _audit_action(settings: Settings, name: str, target: str) -> None:
    """An operator's action from the command line, in the gateway's audit trail (`cli:<user>`)."""
    import getpass

    from worker.gateway.identity.audit import action, write_action

    with sync_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30) as client:
        write_action(client, action(f"cli:{getpass.getuser()}", "default", name, target), settings.audit_stream_maxlen)


# The commands registered apart from `_parser`'s own lines, in the order `--help` lists them.
_COMMANDS = (_audit_command, _dead_letters_command, _approvals_parser, _connections_parser)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def _approvals_list(args: argparse.Namespace) -> int:
    rows = _with_decisions(lambda decisions, me: decisions.waiting(me))
    if args.format == "json":
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    for row in rows if args.format == "lines" else []:
        who = f"{row['principal'] or '-'}/{row['tenant']}"
        print(f"{row['callId']}  {row['tool']}  {who}  {row['target']}  expires {row['expires']}")
    return 0


def _approvals_decide(args: argparse.Namespace) -> int:
    from worker.queue.approvals import NotParked

    try:
        done = _with_decisions(lambda decisions, me: decisions.decide(me, args.call_id, args.decision, args.reason))
    except NotParked as exc:
        print(f"toolworker approvals: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(done, ensure_ascii=False))
    return 0


def _with_decisions(work: Any) -> Any:
    """Run `work(decisions, principal)` against Redis, as the operator at this terminal (every grant: the
    command line reaches Redis itself); its decisions go to the audit trail under `cli:<user>`."""
    import asyncio
    import getpass

    from worker.connections import async_client
    from worker.gateway.decisions import Decisions
    from worker.gateway.identity.audit import AuditTrail
    from worker.gateway.identity.principals import Principal
    from worker.queue.publisher import Publisher

    settings = get_settings()
    _check_redis(settings)

    def publisher(client: Any) -> Publisher:
        return Publisher(client, settings.result_ttl_seconds, settings.reply_stream_maxlen)

    async def run() -> Any:
        clients = [
            async_client(shard.url, socket_connect_timeout=5, socket_timeout=30) for shard in settings.shards.all
        ]
        audit = AuditTrail(clients[0], settings.audit_stream_maxlen)
        try:
            return await work(Decisions(clients, publisher, audit), Principal(f"cli:{getpass.getuser()}"))
        finally:
            await audit.drain()
            for client in clients:
                await client.aclose()

    return asyncio.run(run())
