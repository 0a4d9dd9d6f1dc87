"""`toolworker top`'s frame: one line per queue and tenant with its latest figures and lines of the window."""

from __future__ import annotations

from worker.queue.activity import Point
from worker.top import frame, rows, spark
from worker.watch import Series


def test_spark_scales_to_the_highest_value() -> None:
    """Bars from the lowest to the highest; all zeros are the lowest bar."""
    assert spark([0, 1, 2, 4]) == "▁▃▅█"
    assert spark([0, 0]) == "▁▁"


def test_a_frame_shows_each_series_latest_figures() -> None:
    """The latest slot's rates and quantiles, and the latest age, for each series; none: a line saying so."""
    points = [Point(0, 1.0, 0.0, 0.01, 0.02), Point(2, 3.5, 0.5, 0.02, 0.4)]
    series = [Series("toolcalls", "alpha", points, [(0.0, 1.0), (2.0, 7.25)])]
    text = frame(series)
    line = next(line for line in text.splitlines() if line.startswith("toolcalls"))
    assert line.split()[:7] == ["toolcalls", "alpha", "3.5", "0.5", "0.02", "0.4", "7.25"]
    assert rows(series)[0]["oldest_waiting_s"] == 7.25
    assert "no calls" in frame([])
