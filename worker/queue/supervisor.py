"""`toolworker worker --processes N`: N worker processes under one command, one per core.

A worker process runs all its calls on one event loop, so it uses one core. Each child here is an
ordinary `toolworker worker` with a node name of its own. The supervisor forwards SIGTERM/SIGINT (a warm
shutdown: calls in flight finish), starts a child again when it dies, and serves the metrics of every
child on one port (prometheus-client's multiprocess mode). A child that exits with an error within its
first seconds (bad settings, unreadable definitions) stops the whole worker with its exit code instead
of looping; one killed by a signal is always started again.

With shards (TOOLWORKER_REDIS_SHARDS), N processes take from each shard (TOOLWORKER_SHARD in their
environment): every shard has takers, and a shard that is down holds only its own processes, which wait
for it while the others go on.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import structlog

from worker.metrics import MULTIPROC_DIR_ENV, process_exited, start_metrics_server

SUPERVISED_ENV = "TOOLWORKER_SUPERVISED"
SHARD_ENV = "TOOLWORKER_SHARD"

log = structlog.get_logger("toolworker.supervisor")
_EARLY_EXIT_S = 10.0
_POLL_S = 0.2


@dataclass
class Child:
    index: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


def child_hostname(hostname: str | None, index: int, shard: str = "") -> str:
    """`name@host` becomes `name-<index>@host` (`name-<shard>-<index>@host`); Celery expands %h and friends
    in the child."""
    name, _, host = (hostname or "toolworker@%h").partition("@")
    return f"{name}-{shard + '-' if shard else ''}{index}@{host or '%h'}"


def supervise(
    child_argv: list[str],
    processes: int,
    hostname: str | None,
    metrics_port: int,
    collectors: Sequence[Any] = (),
    shards: Sequence[str] = ("",),
) -> int:
    """Run `processes` children of `python -m worker worker <child_argv> -n <name>` per shard until told
    to stop."""
    own_directory = MULTIPROC_DIR_ENV not in os.environ
    if own_directory:
        os.environ[MULTIPROC_DIR_ENV] = tempfile.mkdtemp(prefix="toolworker-metrics-")
    try:
        return _run(child_argv, processes, hostname, metrics_port, collectors, shards)
    finally:
        if own_directory:
            shutil.rmtree(os.environ.pop(MULTIPROC_DIR_ENV), ignore_errors=True)


def _run(
    child_argv: list[str],
    processes: int,
    hostname: str | None,
    metrics_port: int,
    collectors: Sequence[Any],
    shards: Sequence[str],
) -> int:
    start_metrics_server(metrics_port, collectors=collectors)
    supervisor = Supervisor(child_argv, hostname, shards)
    supervisor.children = {i: supervisor.start(i) for i in range(processes * len(shards))}
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, supervisor.forward)
    while supervisor.children:
        time.sleep(_POLL_S)
        supervisor.reap()
    return supervisor.code


class Supervisor:
    def __init__(self, child_argv: list[str], hostname: str | None, shards: Sequence[str] = ("",)) -> None:
        self.child_argv = child_argv
        self.hostname = hostname
        self.shards = shards
        # The supervisor serves the metrics of all; it checked Redis, so a child started again during an
        # outage waits for Redis as a restarting worker does, instead of failing fast.
        self.env = os.environ | {"TOOLWORKER_METRICS_PORT": "0", SUPERVISED_ENV: "1"}
        self.children: dict[int, Child] = {}
        self.stopping: int | None = None  # the signal forwarded to stop
        self.code = 0

    def start(self, index: int) -> Child:
        shard = self.shards[index % len(self.shards)]
        name = child_hostname(self.hostname, index // len(self.shards), shard)
        argv = [sys.executable, "-m", "worker", "worker", *self.child_argv, "-n", name]
        return Child(index, subprocess.Popen(argv, env=self.env | ({SHARD_ENV: shard} if shard else {})))

    def forward(self, signum: int, _frame: FrameType | None = None) -> None:
        self.stopping = signum
        for child in self.children.values():
            if child.process.poll() is None:
                child.process.send_signal(signum)

    def reap(self) -> None:
        """Forget children that exited; start again those that died on their own."""
        for index, child in list(self.children.items()):
            status = child.process.poll()
            if status is None:
                continue
            process_exited(child.process.pid)
            del self.children[index]
            if self.stopping is not None:
                # A child still starting has no handler yet and dies of the signal itself: a clean stop too.
                self.code = self.code or (0 if status == -self.stopping else abs(status))
            elif status > 0 and time.monotonic() - child.started < _EARLY_EXIT_S:
                log.error("worker.child_failed_at_start", child=index, exitCode=status)
                self.code = abs(status)
                self.forward(signal.SIGTERM)
            else:
                log.warning("worker.child_restarted", child=index, exitCode=status)
                self.children[index] = self.start(index)
