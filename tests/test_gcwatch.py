"""The hub's pauses for Python's garbage collector are counted and the long ones logged (portal/hub/gcwatch.py)."""

from __future__ import annotations

import gc
import logging

import pytest

from portal.hub import gcwatch, metrics

pytestmark = pytest.mark.quick


def test_each_collection_is_counted_by_generation_and_a_long_one_logged(caplog):
    watch = gcwatch.GcWatch(long_pause=0.0)  # every collection counts as long here
    gc.callbacks.append(watch)
    before = metrics.GC_COLLECTIONS.labels("2")._value.get(), metrics.GC_SECONDS.labels("2")._value.get()
    try:
        with caplog.at_level(logging.WARNING):
            gc.collect()  # a full collection: generation 2
    finally:
        gc.callbacks.remove(watch)
    assert metrics.GC_COLLECTIONS.labels("2")._value.get() >= before[0] + 1
    assert metrics.GC_SECONDS.labels("2")._value.get() > before[1]
    assert "The hub paused" in caplog.text and "garbage collector (generation 2" in caplog.text


def test_it_is_installed_once():
    first = gcwatch.install()
    try:
        assert gcwatch.install() is first
        assert sum(isinstance(c, gcwatch.GcWatch) for c in gc.callbacks) == 1
    finally:
        gc.callbacks.remove(first)


def test_the_hubs_set_up_freezes_what_it_built_makes_young_collections_rarer_and_installs_the_watch():
    from portal import cli

    class Hub:
        class log:
            @staticmethod
            def info(*args):
                pass

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    try:
        cli._start_garbage_collection(Hub())
        assert gc.get_threshold()[0] == cli.YOUNG_COLLECTION_EVERY and gc.isenabled() and gc.get_freeze_count() > 0
        assert sum(isinstance(c, gcwatch.GcWatch) for c in gc.callbacks) == 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()
        gc.callbacks[:] = [c for c in gc.callbacks if not isinstance(c, gcwatch.GcWatch)]
