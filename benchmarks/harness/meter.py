"""Measurements: a run's Sample of calls, a process tree's CPU time and RSS (Meter), and a Redis
server's commands and main-thread CPU (Counters)."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks.harness.constants import STOP_TIMEOUT_S
from worker.envelope import ToolResult

RSS_INTERVAL_S = 0.02
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """How many calls, how long they took together, and for each the time from its submission to its result."""

    calls: int
    seconds: float
    latencies_s: list[float]
    failures: Counter[str] = field(default_factory=Counter)
    truncated: int = 0

    def add_result(self, result: ToolResult) -> None:
        if result.exit_code:
            self.failures[f"{result.exit_code}: {(result.error or {}).get('message', '')}"[:120]] += 1
        self.truncated += result.truncated


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants (children of any of its threads)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def rss_mb(pid: int) -> float:
    """Resident memory of a process tree, in MB (pages shared between processes count once per process)."""
    total_kb = 0
    for member in process_tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total_kb / 1024


def cpu_s(pid: int) -> float:
    """CPU time (user + system) used so far by a process tree's living members, in seconds."""
    ticks = 0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLOCK_TICKS


class Meter:
    """While the block runs: the highest RSS of a process tree (sampled in a thread) and its CPU time.

    Without a pid it meters this process (the raw aiohttp client): CPU only."""

    def __init__(self, pid: int | None, interval_s: float = RSS_INTERVAL_S) -> None:
        self._pid = pid
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self.max_rss_mb: float | None = None
        self.cpu_s = 0.0

    def __enter__(self) -> Meter:
        self.cpu_s = -self._cpu()
        if self._pid is not None:
            self.max_rss_mb = rss_mb(self._pid)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_s += self._cpu()
        if self._pid is not None:
            self._stop.set()
            self._thread.join(STOP_TIMEOUT_S)
            self._sample_once()

    def _cpu(self) -> float:
        return time.process_time() if self._pid is None else cpu_s(self._pid)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample_once()

    def _sample_once(self) -> None:
        assert self._pid is not None
        self.max_rss_mb = max(self.max_rss_mb or 0.0, rss_mb(self._pid))


class Counters:
    """The server's command count and main-thread CPU, read before and after a block."""

    def __init__(self, redis_url: str) -> None:
        self._client = redis.Redis.from_url(redis_url)

    def read(self) -> tuple[int, float]:
        """Commands run so far (the reading's own INFO commands included but the last), main-thread CPU s."""
        stats: Any = self._client.info("commandstats")
        commands = sum(int(v["calls"]) for v in stats.values())
        cpu: Any = self._client.info("cpu")
        main_s = float(cpu.get("used_cpu_sys_main_thread", 0.0)) + float(cpu.get("used_cpu_user_main_thread", 0.0))
        return commands, main_s

    @contextmanager
    def during(self) -> Iterator[dict[str, float]]:
        """Commands run and main-thread CPU seconds spent during the block (the readings' excluded)."""
        commands_before, cpu_before = self.read()
        counted: dict[str, float] = {}
        yield counted
        commands_after, cpu_after = self.read()
        counted["commands"] = commands_after - commands_before - 2  # less the first reading's two INFO
        counted["main_thread_s"] = cpu_after - cpu_before

    def close(self) -> None:
        self._client.close()
