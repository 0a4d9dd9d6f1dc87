"""`toolworker call`: one call through the queue, its arguments and headers from the command line; and
`toolworker run-code`: a program (code mode) from a file or standard input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from worker.cli.checks import check_redis
from worker.connections import RedisUnavailable
from worker.redaction import mask_url
from worker.settings import get_settings


def call(args: argparse.Namespace) -> int:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from worker.client import ToolClient

    arguments = _parse_arguments(args.args, args.arg)
    headers = dict(_split(h, ":", "--header") for h in args.header)
    settings = get_settings()
    check_redis(settings)
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


def run_code(args: argparse.Namespace) -> int:
    from worker.client import ToolClient

    code = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    check_redis(get_settings())
    with ToolClient() as client:
        result = client.run_code(code, timeout=args.timeout)
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
