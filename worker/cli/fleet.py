"""The commands that look at the fleet: `queue`, `top`, `shards` and `health`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from worker.cli.checks import check_redis
from worker.cli.output import print_table
from worker.connections import sync_client
from worker.settings import get_settings


def queue(args: argparse.Namespace) -> int:
    """`toolworker queue`: what waits and what runs, per queue and tenant (and shard), read from Redis. A
    shard that does not answer is named on stderr, the others are shown, and the exit status is 1."""
    from worker.queue.depth import shard_rows

    settings = get_settings()
    check_redis(settings)  # the home shard: the routes are there
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
    columns = ["queue", "tenant", "waiting", "queued", "in_flight", "oldest_waiting_s", "oldest_running_s"]
    if not settings.shards.sharded:
        rows = [{k: v for k, v in row.items() if k != "shard"} for row in rows]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        shown = [{k: "-" if v is None else v for k, v in row.items()} for row in rows]
        print_table(shown, ["shard", *columns] if settings.shards.sharded else columns)
        print("waiting: messages in the tenant's lists; queued: calls counted at enqueue; in_flight: calls running")
        print("oldest_waiting_s, oldest_running_s: age of the oldest call waiting, running (since its enqueue)")
    return 1 if problems else 0


def top(args: argparse.Namespace) -> int:
    """`toolworker top`: the fleet live in a terminal (worker/top.py)."""
    from worker.top import run

    return run(args)


def shards(args: argparse.Namespace) -> int:
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


def health(args: argparse.Namespace) -> int:
    from worker.queue.health import check

    healthy, message = check(get_settings().redis_url, args.timeout, args.node)
    print(message, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1
