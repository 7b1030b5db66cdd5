"""The hub's pauses for Python's garbage collector, seen: counted, and the long ones logged.

The hub serves everything on one event loop, and a full collection of Python's cyclic garbage collector (its
generation 2) stops that loop for as long as it takes to walk every object the hub holds: the longer the hub has
served, and the more people it knows, the longer. A pause of half a second sets the loop lagging, and what lags
sheds page views (loadshed.py). So each collection's time goes to ``dsportal_gc_seconds`` (by generation, with
``dsportal_gc_collections``), and one of at least LONG_PAUSE seconds is logged.

What the hub built to start is frozen out of the collector's way, and its young collections are rarer
(portal/cli.py, ``_start_garbage_collection``, which installs this watch too); this module only watches.
Python's public hook (``gc.callbacks``); nothing of JupyterHub is touched.
"""

from __future__ import annotations

import gc
import time

from traitlets.log import get_logger

from portal.hub import metrics

LONG_PAUSE = 0.25  # seconds: a collection at least this long is logged


class GcWatch:
    """A ``gc.callbacks`` entry: each collection's seconds counted by generation, a long one logged."""

    def __init__(self, long_pause: float = LONG_PAUSE):
        self.long_pause = long_pause
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = int(info.get("generation", 0))
        metrics.GC_SECONDS.labels(str(generation)).inc(took)
        metrics.GC_COLLECTIONS.labels(str(generation)).inc()
        if took >= self.long_pause:
            get_logger().warning("The hub paused %.2f s for Python's garbage collector (generation %d, %d objects collected): "
                        "its event loop served nothing meanwhile", took, generation, info.get("collected", 0))


def install() -> GcWatch:
    """The watch, once per process."""
    for callback in gc.callbacks:
        if isinstance(callback, GcWatch):
            return callback
    watch = GcWatch()
    gc.callbacks.append(watch)
    return watch
