"""Figures as the sections report them: percentiles, labels of sizes and cells, a target met or missed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from benchmarks.harness.constants import KB, MB


@dataclass(frozen=True)
class Target:
    """One of the issues' targets, with the figure that judges it."""

    name: str
    shown: str
    met: bool


def percentile_ms(ordered_s: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted seconds, in ms."""
    index = max(0, min(len(ordered_s) - 1, math.ceil(p * len(ordered_s)) - 1))
    return ordered_s[index] * 1000


def size_label(body_bytes: int) -> str:
    if body_bytes >= MB:
        return f"{body_bytes / MB:g} MB"
    return f"{body_bytes / KB:g} KB" if body_bytes >= KB else f"{body_bytes} B"


def cell_label(row: dict[str, Any]) -> str:
    """An upstream of the matrix: its latency and body size."""
    return f"{row['latency_ms']:g} ms, {size_label(row['body_bytes'])}"
