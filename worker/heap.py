"""The garbage collector of a worker process, tuned once the worker has started."""

from __future__ import annotations

import gc

# Collector thresholds once the start-up heap is frozen. A young collection comes after 20,000 new objects:
# more than the calls of a busy worker hold at once (200 in flight, some 80 each), so that it finds them gone
# rather than scanning them again and again (at 2,000 the collector took 6% of a call's CPU, 0.019 ms, and
# collected every 26 calls); one took 2.5 ms at most in bursts of 20,000 calls. A full one waits for 100
# middle ones instead of 10.
GC_THRESHOLDS = (20000, 10, 100)


def settle_heap() -> None:
    """Keep the garbage collector off what lives for the whole process.

    Celery, pydantic and the definitions are hundreds of thousands of objects that never become garbage,
    and calls in flight are many more that live for a while. With Python's defaults a burst of calls
    set off full collections over all of them: 50-300 ms each, with the event loop stopped (2.7 s of
    pauses in three bursts of 5,000 calls at a 100 ms upstream). Frozen, the start-up heap is no longer
    scanned, and the thresholds keep full collections rare."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
