"""`toolworker top`: the fleet live in a terminal, the figures of the console's chart (worker/watch.py): per
queue and tenant, calls per second (ok / failed), the p50 and p99 duration and the oldest waiting call's
age, with a line of the last minutes for calls/s and for the age. Redrawn every --interval seconds until
interrupted; `--once` prints one frame (and `--format json` its figures) and exits."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from worker.connections import sync_client
from worker.settings import get_settings
from worker.watch import Series, Watch

BARS = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 30
_CLEAR = "\x1b[H\x1b[2J"


def run(args: argparse.Namespace) -> int:
    settings = get_settings()
    options: dict[str, Any] = {"socket_connect_timeout": 2.0, "socket_timeout": 5.0}
    clients = [sync_client(shard.url, **options) for shard in settings.shards.all]
    watch = Watch(clients)
    try:
        if args.once:
            series = watch.series()
            print(json.dumps(rows(series), indent=2) if args.format == "json" else frame(series))
            return 0
        while True:
            text = frame(watch.series())
            sys.stdout.write((_CLEAR if sys.stdout.isatty() else "") + text + "\n")
            sys.stdout.flush()
            time.sleep(max(args.interval, 0.5))
    except KeyboardInterrupt:
        return 0
    finally:
        for client in clients:
            client.close()


def rows(series: Sequence[Series]) -> list[dict[str, Any]]:
    """The latest figures of each queue and tenant (what `--format json` prints)."""
    return [{"queue": s.queue, "tenant": s.tenant, **s.now} for s in series]


def frame(series: Sequence[Series]) -> str:
    """One frame: a line per queue and tenant, then a line saying what the columns are."""
    head = f"{'QUEUE':<16} {'TENANT':<14} {'OK/S':>7} {'FAIL/S':>7} {'P50':>7} {'P99':>7} {'WAITING':>8}  CALLS/S, AGE"
    lines = [time.strftime("toolworker top  %H:%M:%S  (the last 5 minutes)"), head]
    for s in series:
        now = s.now
        calls = [p.ok_per_s + p.failed_per_s for p in s.points]
        ages = [age for _, age in s.ages]
        lines.append(
            f"{s.queue[:16]:<16} {s.tenant[:14]:<14} {_n(now['ok_per_s']):>7} {_n(now['failed_per_s']):>7} "
            f"{_n(now['p50_s']):>7} {_n(now['p99_s']):>7} {_n(now['oldest_waiting_s']):>8}  "
            f"{spark(calls)} {spark(ages)}"
        )
    if not series:
        lines.append("(no calls and nothing waiting in the last 5 minutes)")
    lines.append("OK/S, FAIL/S: calls answered per second; P50, P99: duration (s); WAITING: oldest waiting call (s)")
    return "\n".join(lines)


def spark(values: Sequence[float]) -> str:
    """The last SPARK_POINTS values as bars, scaled to their highest (all bottom bars when all are 0)."""
    shown = list(values)[-SPARK_POINTS:]
    top = max(shown, default=0.0)
    if top <= 0:
        return BARS[0] * len(shown)
    return "".join(BARS[min(len(BARS) - 1, int(value / top * (len(BARS) - 1) + 0.5))] for value in shown)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
