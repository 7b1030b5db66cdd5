"""The hub's pauses for Python's garbage collector, seen: counted, and the long ones logged.

The hub serves everything on one event loop, and a full collection of Python's cyclic garbage collector (its
generation 2) stops that loop for as long as it takes to walk every object the hub holds: the longer the hub has
served, and the more people it knows, the longer. A pause of half a second sets the loop lagging, and what lags
sheds page views (loadshed.py). So each collection's time goes to ``dsportal_gc_seconds`` (by generation, with
``dsportal_gc_collections``), and one of at least LONG_PAUSE seconds is logged.

Once the hub has started (its application built, every session it had loaded), what it built to start is moved out
of the collector's way (``gc.freeze``): the modules, classes, templates and settings it keeps for its whole life are
then no longer walked by each full collection, which walks only what came after. Those objects are still freed when
nothing refers to them; only a cycle among them that became garbage would stay, and the hub keeps them for its
life anyway.

Python's public hooks (``gc.callbacks``, ``gc.freeze``); nothing of JupyterHub is touched.
"""

from __future__ import annotations

import gc
import logging
import time

from portal.hub import metrics
from portal.upstream import hub as upstream

log = logging.getLogger(__name__)

LONG_PAUSE = 0.25  # seconds: a collection at least this long is logged


class GcWatch:
    """A ``gc.callbacks`` entry: each collection's seconds counted by generation, a long one logged."""

    def __init__(self, long_pause: float = LONG_PAUSE):
        self.long_pause = long_pause
        self._started = 0.0
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = int(info.get("generation", 0))
        self.seconds[generation] += took
        self.collections[generation] += 1
        metrics.GC_SECONDS.labels(str(generation)).inc(took)
        metrics.GC_COLLECTIONS.labels(str(generation)).inc()
        if took >= self.long_pause:
            log.warning("The hub paused %.2f s for Python's garbage collector (generation %d, %d objects collected): "
                        "its event loop served nothing meanwhile", took, generation, info.get("collected", 0))


def freeze_what_started(hub=None) -> int:
    """Collect once, then move every object the collector tracks out of its way (gc.freeze); how many."""
    gc.collect()
    frozen = len(gc.get_objects())
    gc.freeze()
    log.info("dsportal: %d objects the hub built to start are no longer walked by the garbage collector (gc.freeze)",
             frozen)
    return frozen


def install() -> GcWatch:
    """The watch, once per process; the freeze once the hub's application is built."""
    for callback in gc.callbacks:
        if isinstance(callback, GcWatch):
            return callback
    watch = GcWatch()
    gc.callbacks.append(watch)
    upstream.after_init_tornado_application(freeze_what_started)
    return watch
