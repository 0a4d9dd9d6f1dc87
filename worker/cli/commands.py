"""The `toolworker` commands as a table (COMMANDS: a Command per command, its arguments and its handler),
the parser built from it, and `main`, which turns what a command raises into an exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worker.cli import calls, definitions, fleet, operators, serve, upstreams
from worker.connections import RedisUnavailable
from worker.constants import CODE_CALL_TIMEOUT_S
from worker.errors import RedisLost


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="toolworker", description="Execute LLM agents' HTTP tool calls.")
    _add_commands(top, COMMANDS, "COMMAND")
    return top


@dataclass(frozen=True)
class Arg:
    """One argument of a command: its names and argparse's keywords for it."""

    names: tuple[str, ...]
    options: Mapping[str, Any]


def arg(*names: str, **options: Any) -> Arg:
    return Arg(names, options)


@dataclass(frozen=True)
class Command:
    """A command (or one action of a command): its help, its arguments, and what runs it (`handler`, with
    `defaults` set beside the arguments), or the actions it takes (`toolworker dead-letters list`, ...)."""

    name: str
    help: str
    handler: Callable[[argparse.Namespace], int] | None = None
    args: tuple[Arg, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    actions: tuple[Command, ...] = ()
    actions_metavar: str | None = "ACTION"
    # Where the chosen action's name goes, when the handler reads it there (`args.action`).
    actions_dest: str | None = None
    # False: the command alone does its default action (`toolworker upstreams` lists).
    actions_required: bool = True


def _add_commands(
    parser: argparse.ArgumentParser,
    commands: Sequence[Command],
    metavar: str | None,
    dest: str | None = None,
    required: bool = True,
) -> None:
    named = {"dest": dest} if dest else {}
    subparsers = parser.add_subparsers(required=required, metavar=metavar, **named)
    for command in commands:
        one = subparsers.add_parser(command.name, help=command.help)
        for argument in command.args:
            one.add_argument(*argument.names, **argument.options)
        if command.actions:
            _add_commands(one, command.actions, command.actions_metavar, command.actions_dest, command.actions_required)
        handler = {"handler": command.handler} if command.handler else {}
        if handler or command.defaults:
            one.set_defaults(**handler, **command.defaults)


# The commands, in the order `--help` lists them: a new command is a handler in a module of its kind and
# a row here.

_GATEWAY_OPTIONS = (
    arg("--tag", action="append", default=[], help="offer only tools with this tag (repeatable)"),
    arg(
        "--mode",
        choices=["all", "discovery", "code"],
        default=None,
        help="discovery: meta-tools only; code: find tools, run programs (default: TOOLWORKER_GATEWAY_MODE)",
    ),
)
_ITEM = arg("item", metavar="N", help="the item's id, as `dead-letters list` prints it")
_DEAD_LETTER_ACTIONS = (
    Command("list", "one line per item: its N (a stable id) and reason", defaults={"action": "list"}),
    Command(
        "show",
        "print that item only, redacted (header names kept, values never stored)",
        args=(_ITEM,),
        defaults={"action": "show"},
    ),
    Command(
        "replay",
        "enqueue the item's calls again with their callIds (each answered once)",
        args=(_ITEM,),
        defaults={"action": "replay"},
    ),
    Command(
        "purge",
        "remove exactly that item",
        args=(_ITEM, arg("--yes", action="store_true", help="accepted for scripts (purge never asks)")),
        defaults={"action": "purge"},
    ),
)
_DECISION_ARGS = (
    arg("call_id", metavar="ID"),
    arg("--reason", default="", metavar="R", help="why (in the audit trail; a denial's envelope)"),
)
_APPROVAL_ACTIONS = (
    Command(
        "list",
        "the calls waiting for a decision, one line each, callId first",
        operators.approvals_list,
        (arg("--format", choices=["lines", "json"], default="lines"),),
    ),
    Command(
        "approve",
        "approve a parked call: it runs once",
        operators.approvals_decide,
        _DECISION_ARGS,
        {"decision": "approve"},
    ),
    Command("deny", "deny it: answered 77", operators.approvals_decide, _DECISION_ARGS, {"decision": "deny"}),
)
_USER = arg("--user", required=True, metavar="U")
_CONNECTION_ACTIONS = (
    Command("list", "a user's connections: upstream, scopes, expiry (never a token)", args=(_USER,)),
    Command(
        "revoke",
        "revoke a user's grant at the authorization server and remove it",
        args=(_USER, arg("--upstream", required=True, metavar="X")),
    ),
)
_UPSTREAM_ACTIONS = (
    Command("list", "one line per upstream (the default)"),
    Command("refresh", "read an MCP upstream's tools now", args=(arg("name"),)),
    Command(
        "accept",
        "serve what `pin: true` withheld (one tool: the server's own name for it)",
        args=(arg("name"), arg("tool", nargs="?")),
    ),
)
COMMANDS: tuple[Command, ...] = (
    Command(
        "worker",
        "run a worker (extra arguments go to `celery worker`)",
        serve.worker,
        (
            arg("-c", "--concurrency", type=int, help="pool size (TOOLWORKER_CONCURRENCY)"),
            arg(
                "-P",
                "--pool",
                choices=["threads", "prefork", "solo"],
                default="threads",
                help="threads: calls on the event loop",
            ),
            arg("-Q", "--queues", help="comma-separated queues to consume (default: toolcalls)"),
            arg("-n", "--hostname", help="worker node name"),
            arg("--processes", type=int, help="worker processes, one core each (TOOLWORKER_PROCESSES)"),
            arg("--loglevel", default="INFO"),
        ),
    ),
    Command(
        "dev",
        "the local stack: Redis-compatible server, demo upstream, worker, Flower",
        serve.dev,
        (arg("--flower-port", type=int, default=5555),),
    ),
    Command(
        "call",
        "call a tool and print its envelope; exits with its exitCode",
        calls.call,
        (
            arg("tool"),
            arg("--arg", action="append", default=[], metavar="K=V", help="an argument (V parsed as JSON)"),
            arg("--args", metavar="JSON", help="all arguments as a JSON object"),
            arg("--header", action="append", default=[], metavar="K:V", help="a per-call header"),
            arg("--timeout", type=float, default=60.0, metavar="S"),
            arg("--no-wait", action="store_true", help="print the callId and exit"),
        ),
    ),
    Command(
        "run-code",
        "run a program (code mode), print its envelope; exits with its exitCode",
        calls.run_code,
        (
            arg("file", help="the program's file, or - for standard input"),
            arg("--timeout", type=float, default=CODE_CALL_TIMEOUT_S, metavar="S"),
        ),
    ),
    Command(
        "tools",
        "list (or search) the tools of the definitions store",
        definitions.tools,
        (
            arg("--tag", action="append", default=[], help="only tools with this tag (repeatable)"),
            arg("--search", metavar="Q", help="the tools that best match a question"),
            arg("--top-k", type=int, default=5, metavar="N"),
            arg("--format", choices=["table", "json", "openai", "anthropic", "mcp"], default="table"),
        ),
    ),
    Command(
        "import-openapi",
        "turn an OpenAPI 3.x / Swagger 2.0 spec into definitions",
        definitions.import_openapi,
        (
            arg("spec", type=Path),
            arg("--upstream", required=True, help="the upstream name the tools will use"),
            arg("--base-url", help="the upstream's base URL (default: the spec's servers)"),
            arg("--tag", action="append", default=[], help="only operations with this tag (repeatable)"),
            arg("-o", "--output", type=Path, help="write here instead of standard output"),
        ),
    ),
    Command("schema", "print a tool's full definition", definitions.schema, (arg("tool"),)),
    Command(
        "health",
        "exit 0 when a worker answers a ping through the broker, else 1",
        fleet.health,
        (
            arg("--node", help="the worker node that must answer (%%h: this host's name), e.g. celery@%%h"),
            arg("--timeout", type=float, default=5.0, metavar="S"),
        ),
    ),
    Command(
        "publish",
        "check definitions and make them the version workers serve",
        definitions.publish,
        (arg("paths", nargs="*", type=Path),),
    ),
    Command(
        "gateway",
        "the agent gateway over HTTP: MCP at /mcp, /toolserver, /v1",
        serve.gateway,
        (
            arg("--host", help="address to listen on (TOOLWORKER_GATEWAY_HOST; loopback without tokens)"),
            arg("--port", type=int, help="port (TOOLWORKER_GATEWAY_PORT)"),
            *_GATEWAY_OPTIONS,
        ),
    ),
    Command("mcp", "the agent gateway as an MCP server on stdio (desktop MCP clients)", serve.mcp, _GATEWAY_OPTIONS),
    Command(
        "queue",
        "calls waiting and in flight, per queue and tenant",
        fleet.queue,
        (
            arg("-Q", "--queues", help="comma-separated queues (default: toolcalls and every routed queue)"),
            arg("--format", choices=["table", "json"], default="table"),
        ),
    ),
    Command(
        "top",
        "the fleet live: calls/s, p50/p99, oldest waiting age per queue and tenant",
        fleet.top,
        (
            arg("--interval", type=float, default=2.0, metavar="S", help="seconds between frames (default 2)"),
            arg("--once", action="store_true", help="print one frame and exit"),
            arg("--format", choices=["table", "json"], default="table", help="json: with --once"),
        ),
    ),
    Command(
        "shards",
        "the shards of TOOLWORKER_REDIS_SHARDS, or the one a tenant lives on",
        fleet.shards,
        (arg("--tenant", metavar="T", help="print only the shard of tenant T"),),
    ),
    Command(
        "validate",
        "check definitions; lists every problem, non-zero on any",
        definitions.validate,
        (arg("paths", nargs="*", type=Path),),
    ),
    Command(
        "audit",
        "the gateway's audit trail: one JSON line per call it took",
        operators.audit_trail,
        (
            arg("--principal", metavar="P", help="only this principal's calls"),
            arg("--since", metavar="T", help="from this time on: ISO 8601, or an age like 15m, 2h, 7d"),
        ),
    ),
    Command(
        "dead-letters",
        "messages the workers refused: list, show, replay, purge",
        operators.dead_letters,
        (arg("--shard", metavar="S", help="with shards: the shard whose items (default: the first)"),),
        actions=_DEAD_LETTER_ACTIONS,
    ),
    Command("approvals", "calls parked for a human's approval: list, approve, deny", actions=_APPROVAL_ACTIONS),
    Command(
        "connections",
        "end users' connections to upstreams that act for them",
        operators.connections,
        actions=_CONNECTION_ACTIONS,
        actions_metavar=None,
        actions_dest="action",
    ),
    Command(
        "upstreams",
        "the upstreams (kind, protocol, tools, last refresh, error); refresh or accept an MCP upstream's",
        upstreams.upstreams,
        defaults={"action": "list"},
        actions=_UPSTREAM_ACTIONS,
        actions_dest="action",
        actions_required=False,
    ),
)
