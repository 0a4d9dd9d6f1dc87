"""An operator's commands: the audit trail, dead letters, approvals and end users' connections; a dead letter
replayed or purged and a decision on a parked call go to the audit trail as `cli:<user>`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from worker.cli.checks import check_redis
from worker.cli.definitions import load_toolset
from worker.connections import sync_client
from worker.settings import Settings, get_settings


def audit_trail(args: argparse.Namespace) -> int:

    from worker.gateway.identity import audit

    settings = get_settings()
    try:
        start_ms = audit.since_ms(args.since) if args.since else 0
    except ValueError as exc:
        print(f"toolworker audit: {exc}", file=sys.stderr)
        return 64
    check_redis(settings)
    client = sync_client(settings.redis_url, socket_connect_timeout=5, socket_timeout=30)
    try:
        for record in audit.read(client, args.principal, start_ms):
            print(json.dumps(record, ensure_ascii=False))
    finally:
        client.close()
    return 0


def connections(args: argparse.Namespace) -> int:
    import asyncio

    from worker.gateway.rest.connections import run_command

    settings = get_settings()
    check_redis(settings)
    toolset = load_toolset([]) if args.action == "revoke" else None
    code, lines = asyncio.run(run_command(settings, args.action, args.user, getattr(args, "upstream", None), toolset))
    for line in lines:
        print(line, file=sys.stdout if code == 0 else sys.stderr)
    return code


def dead_letters(args: argparse.Namespace) -> int:
    import asyncio

    settings = get_settings()
    try:  # items stay on the shard they were found on
        url = settings.shards.named(args.shard).url if args.shard else settings.redis_url
    except ValueError as exc:
        raise SystemExit(f"toolworker dead-letters: {exc}") from None
    check_redis(settings)
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


def approvals_list(args: argparse.Namespace) -> int:
    rows = _with_decisions(lambda decisions, me: decisions.waiting(me))
    if args.format == "json":
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    for row in rows if args.format == "lines" else []:
        who = f"{row['principal'] or '-'}/{row['tenant']}"
        print(f"{row['callId']}  {row['tool']}  {who}  {row['target']}  expires {row['expires']}")
    return 0


def approvals_decide(args: argparse.Namespace) -> int:
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
    check_redis(settings)

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
