"""py-spy on one process while a load keeps it busy: the collapsed stacks and a flame graph saved, the
functions with the largest inclusive and own shares summed up (`make profile`, `python -m benchmarks.gateway
--profile DIR`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.constants import CALL_TIMEOUT_S, ROOT

RATE_HZ = 200
SECONDS = 8
TOP = 25


def profile(pid: int, what: str, directory: Path, keep_busy: Callable[[threading.Event], None]) -> str:
    """Sample `pid` (every thread) twice, for the stacks and the flame graph, while `keep_busy` runs until its
    event is set; DIR/<what>.collapsed and DIR/<what>.svg, and the summary to print."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    directory.mkdir(parents=True, exist_ok=True)
    collapsed, svg = directory / f"{what}.collapsed", directory / f"{what}.svg"
    for output in (["--format", "raw", "-o", str(collapsed)], ["--format", "flamegraph", "-o", str(svg)]):
        argv = [spy, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--duration", str(SECONDS), "--nonblocking"]
        done = threading.Event()
        load = threading.Thread(target=keep_busy, args=(done,), daemon=True)
        load.start()
        try:
            subprocess.run([*argv, *output], check=True, capture_output=True)
        finally:
            done.set()
            load.join(CALL_TIMEOUT_S)
    return f"{summary(collapsed.read_text(), what)}\n\nstacks: {collapsed}\nflame graph: {svg}"


def summary(collapsed: str, what: str = "the process", top: int = TOP) -> str:
    """The functions with the largest shares of the samples: inclusive (on the stack) and own (on top)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [_function(frame) for frame in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples of {what} (every thread), {RATE_HZ} Hz"]
    for title, counted in (("inclusive", inclusive), ("own", own)):
        lines.append(f"\ntop {top}, {title}:")
        lines += [f"  {count / max(total, 1):6.1%}  {name}" for name, count in counted.most_common(top)]
    return "\n".join(lines)


def _function(frame: str) -> str:
    """`name (path/to/module.py:line)` without the line: one entry per function."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0].removeprefix(f"{ROOT}/").rpartition("site-packages/")[2]
    return f"{name} ({path})" if path else name
