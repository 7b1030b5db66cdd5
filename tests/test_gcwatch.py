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
    before = metrics.GC_COLLECTIONS.labels("2")._value.get()
    try:
        with caplog.at_level(logging.WARNING, logger="portal.hub.gcwatch"):
            gc.collect()  # a full collection: generation 2
    finally:
        gc.callbacks.remove(watch)
    assert watch.collections[2] >= 1 and watch.seconds[2] > 0
    assert metrics.GC_COLLECTIONS.labels("2")._value.get() >= before + 1
    assert "The hub paused" in caplog.text and "garbage collector (generation 2" in caplog.text


def test_it_is_installed_once_and_freezes_once_the_hubs_application_is_built(monkeypatch):
    from portal.upstream import hub as upstream

    hooked = []
    monkeypatch.setattr(upstream, "after_init_tornado_application", hooked.append)
    first = gcwatch.install()
    try:
        assert gcwatch.install() is first
        assert sum(isinstance(c, gcwatch.GcWatch) for c in gc.callbacks) == 1
        assert hooked == [gcwatch.freeze_what_started]
    finally:
        gc.callbacks.remove(first)


def test_what_the_hub_built_to_start_is_no_longer_walked_and_still_freed():
    import weakref

    class Built:
        pass

    kept = Built()
    kept.cycle = kept  # a cycle: only the collector would free it
    gone = Built()
    seen_gone = weakref.ref(gone)
    try:
        assert gcwatch.freeze_what_started() >= 2
        assert gc.get_freeze_count() >= 2
        assert not any(found is kept for found in gc.get_objects())  # no collection walks it any more
        del gone  # no cycle: freed by its reference count, frozen or not
        assert seen_gone() is None
    finally:
        gc.unfreeze()
