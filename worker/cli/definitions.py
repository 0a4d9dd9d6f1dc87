"""The commands on definitions: `tools`, `schema`, `import-openapi`, `publish` and `validate`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from worker.cli.checks import check_redis
from worker.cli.output import print_table, progress
from worker.connections import RedisUnavailable, sync_client
from worker.redaction import mask_url
from worker.settings import Settings, get_settings


def load_toolset(paths: list[Path]) -> Any:
    """The definitions as a worker serves them (built-in catalog tools, MCP upstreams' tools as listed) when no
    path is given."""
    from worker.definitions import file_store
    from worker.definitions.builtin import served_toolset
    from worker.definitions.mcp_tools import with_listings
    from worker.http.egress import EgressPolicy

    if paths:  # files checked on their own: the fleet's listings are not read
        return with_listings(file_store.load(paths), {})
    settings = get_settings()
    defined = _with_listings(file_store.load([settings.definitions]), settings)
    return served_toolset(defined, EgressPolicy.parse(settings.egress_allow).enabled)


def _with_listings(toolset: Any, settings: Settings) -> Any:
    """The toolset with the MCP upstreams' tools as stored in Redis (none when Redis is not reachable)."""
    from redis.exceptions import RedisError

    from worker.definitions import listings
    from worker.definitions.mcp_tools import with_listings

    if not any(upstream.mcp for upstream in toolset.upstreams.values()):
        return toolset
    client = sync_client(settings.redis_url, socket_connect_timeout=2, socket_timeout=10)
    try:
        return with_listings(toolset, listings.read(client))
    except RedisError as exc:
        print(f"MCP upstreams' listings not read (Redis: {exc})", file=sys.stderr)
        return with_listings(toolset, {})
    finally:
        client.close()


def tools(args: argparse.Namespace) -> int:
    from worker.definitions import catalog

    toolset = load_toolset([])
    rows = catalog.search(toolset, args.search, args.top_k) if args.search else catalog.list_tools(toolset, args.tag)
    exports = {"openai": catalog.to_openai, "anthropic": catalog.to_anthropic, "mcp": catalog.to_mcp}
    if args.format in exports:
        tools = [toolset.tools[row["name"]] for row in rows]  # the tools themselves: their kind sets MCP hints
        print(json.dumps(exports[args.format](tools), indent=2, ensure_ascii=False))
    elif args.format == "json":
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        print_table(rows, ["name", "method", "path", "upstream", "summary"])
    return 0


def import_openapi(args: argparse.Namespace) -> int:
    import yaml

    from worker.definitions.model import Problem
    from worker.definitions.readers.openapi import SpecError, import_openapi

    problems: list[Problem] = []
    progress(f"reading {args.spec} ({args.spec.stat().st_size // 1024} KiB) and building every input schema")
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


def schema(args: argparse.Namespace) -> int:
    from worker.definitions import catalog

    found = catalog.schemas(load_toolset([]), [args.tool])
    if found["missing"]:
        print(f"toolworker: no tool named {args.tool!r}", file=sys.stderr)
        return 64
    print(json.dumps(found["tools"][0], indent=2, ensure_ascii=False))
    return 0


def publish(args: argparse.Namespace) -> int:
    import redis

    from worker.definitions import file_store, redis_store

    settings = get_settings()
    paths = args.paths or [settings.definitions]
    progress(f"checking {len(file_store.definition_files(paths))} definitions files")
    check_redis(settings)
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


def validate(args: argparse.Namespace) -> int:
    from worker.definitions.file_store import unset_settings

    toolset = load_toolset(args.paths)
    for problem in toolset.problems:
        print(problem, file=sys.stderr)
    for notice in toolset.notices:
        print(f"notice: {notice}", file=sys.stderr)
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
