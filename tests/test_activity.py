"""The fleet's activity slots: per queue and tenant, calls per second (ok / failed) and p50 / p99 durations."""

from __future__ import annotations

import fakeredis
import pytest

from worker.queue import activity
from worker.queue.activity import SLOT_S, Recorder, quantile, read


def test_counts_land_in_the_slot_of_their_time_and_read_back_as_rates() -> None:
    """Calls counted by two processes add up in Redis; the slot under way is not shown yet."""
    client = fakeredis.FakeRedis()
    at = 1_800_000_000.0
    for recorder in (Recorder(client), Recorder(client)):
        for _ in range(4):
            recorder.observe("toolcalls", "alpha", True, 0.02, at_s=at)
        recorder.observe("toolcalls", "alpha", False, 3.0, at_s=at)
        recorder.flush()
    series = read([client], window_s=60, now_s=at + SLOT_S)
    point = series[("toolcalls", "alpha")][-1]
    assert point.at_s == activity.slot_of(at)
    assert point.ok_per_s == 8 / SLOT_S and point.failed_per_s == 2 / SLOT_S
    assert point.p50_s is not None and point.p99_s is not None
    assert 0.01 < point.p50_s <= 0.025 and 2.5 < point.p99_s <= 5.0
    assert read([client], window_s=60, now_s=at) == {}


def test_shards_are_summed_and_idle_slots_are_zero() -> None:
    """Two shards' slots add up; a slot without calls is a zero rate with no duration."""
    shards = [fakeredis.FakeRedis(), fakeredis.FakeRedis()]
    at = 1_800_000_000.0
    for client in shards:
        recorder = Recorder(client)
        recorder.observe("q", "default", True, 0.1, at_s=at)
        recorder.flush()
    points = read(shards, window_s=10, now_s=at + 3 * SLOT_S)[("q", "default")]
    assert [p.ok_per_s for p in points][-3:] == [2 / SLOT_S, 0, 0]
    assert points[-1].p50_s is None


def test_quantiles_interpolate_within_buckets() -> None:
    """The Prometheus way: linear within the bucket the rank falls in; nothing counted gives None."""
    assert quantile(0.5, [0] * 15) is None
    assert quantile(0.5, [10] + [0] * 14) == pytest.approx(0.0025)
    assert quantile(0.99, [0] * 14 + [3]) == 120.0


def test_a_duration_lands_in_the_first_bucket_that_holds_it() -> None:
    """A duration on a bound is in that bound's bucket; one past every bound in the last."""
    bounds = activity.DURATION_BUCKETS_S
    assert activity.bucket_of(0.0) == 0
    assert [activity.bucket_of(bound) for bound in bounds] == list(range(len(bounds)))
    assert [activity.bucket_of(bound * 1.001) for bound in bounds] == list(range(1, len(bounds) + 1))
