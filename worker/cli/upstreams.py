"""`toolworker upstreams`: the upstreams (kind, protocol negotiated, tools, last refresh, last error), and
for an MCP upstream `refresh NAME` (read its tools now) and `accept NAME [TOOL]` (serve what `pin` withheld)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from worker.cli.checks import check_redis
from worker.cli.output import print_table
from worker.connections import sync_client
from worker.logs import configure
from worker.settings import Settings, get_settings


def upstreams(args: argparse.Namespace) -> int:
    from worker.definitions import listings
    from worker.upstreams.operate import Operator, rows

    settings = get_settings()
    configure(settings.log_format, settings.log_level)  # log lines to stderr: stdout is the answer
    check_redis(settings)
    toolset = _served_definitions(settings)
    operator = Operator(settings)
    try:
        if args.action == "refresh":
            print(json.dumps(asyncio.run(operator.refresh(toolset, args.name)).summary(), ensure_ascii=False))
        elif args.action == "accept":
            print(json.dumps(asyncio.run(operator.accept(args.name, args.tool)).summary(), ensure_ascii=False))
        else:
            client = sync_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
            try:
                found = listings.read(client)
            finally:
                client.close()
            print_table(rows(toolset, found), ["name", "kind", "protocol", "tools", "listedAt", "error"])
    except KeyError as exc:
        print(f"toolworker upstreams: {exc.args[0]}", file=sys.stderr)
        return 64
    return 0


def _served_definitions(settings: Settings) -> Any:
    """The definitions the workers serve: the published version with the Redis store, else the folder."""
    from worker.definitions import file_store, redis_store
    from worker.definitions.model import ToolSet

    if settings.store != "redis":
        return file_store.load([settings.definitions])
    client = sync_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
    try:
        payload = redis_store.current_payload(client)
    finally:
        client.close()
    return ToolSet() if payload is None else redis_store.Bundles().load(payload)[1]
