"""The long-running commands: `worker` (restarting itself in place after a broker failure), `dev`,
`gateway` and `mcp`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from worker.cli.checks import check_redis, vault_keys_usable
from worker.connections import sync_client
from worker.constants import DEFAULT_QUEUE
from worker.settings import Settings, get_settings

_MAX_RESTARTS = 5


# Set for the processes a supervisor starts, and for a worker restarting itself in place: they retry a
# Redis that went away (recovery) instead of failing fast as a start with bad settings does.
_RESTARTS_ENV = "TOOLWORKER_RESTARTS"


def _queue_gauges(settings: Settings, queues: str | None) -> list[Any]:
    """The queue depth, in-flight and age gauges of the queues this worker consumes (the ages over every
    shard; the depth and in-flight of the home one)."""

    from worker.queue.ages import QueueAges
    from worker.queue.depth import QueueDepth

    options: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    client = sync_client(settings.redis_url, **options)
    shards = [client] + [sync_client(shard.url, **options) for shard in settings.shards.all[1:]]
    served = [q.strip() for q in (queues or DEFAULT_QUEUE).split(",") if q.strip()]
    return [QueueDepth(client, served), QueueAges(shards, served)]


def worker(args: argparse.Namespace) -> int:
    from worker.logs import configure

    settings = get_settings()
    configure(settings.log_format, settings.log_level)
    if not vault_keys_usable(settings):
        return 78
    concurrency = args.concurrency or settings.concurrency
    processes = args.processes or settings.processes
    from worker.queue.supervisor import SUPERVISED_ENV

    if not (os.environ.get(_RESTARTS_ENV) or os.environ.get(SUPERVISED_ENV)):
        check_redis(settings)
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


def dev(args: argparse.Namespace) -> int:
    from worker.dev.stack import run_dev_stack

    return run_dev_stack(flower_port=args.flower_port)


def gateway(args: argparse.Namespace) -> int:
    from worker.gateway.app import serve
    from worker.gateway.mcp.server import Options
    from worker.logs import configure

    settings = get_settings()
    configure(settings.log_format, settings.log_level)
    if not vault_keys_usable(settings):
        return 78
    return serve(settings, Options(args.tag, args.mode or settings.gateway_mode), args.host, args.port)


def mcp(args: argparse.Namespace) -> int:
    from worker.gateway.mcp.server import Options
    from worker.gateway.mcp.stdio import serve_stdio
    from worker.logs import configure

    settings = get_settings()
    configure(settings.log_format, settings.log_level)
    if not vault_keys_usable(settings):
        return 78
    return serve_stdio(settings, Options(args.tag, args.mode or settings.gateway_mode))
