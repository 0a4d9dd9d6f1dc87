"""The worker process's own housekeeping."""

from __future__ import annotations

import gc

from worker.queue.service import GC_THRESHOLDS, settle_heap


def test_settle_heap_takes_the_start_up_heap_out_of_collections() -> None:
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 10_000  # the interpreter, pytest and the worker modules at least
        assert gc.get_threshold() == GC_THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
