"""engine.gc_pauses: the collector's runs are counted and timed, and loading's objects frozen."""

from __future__ import annotations

import gc

from engine.gc_pauses import GcPauses, freeze_loaded


def test_pauses_are_counted_per_generation_and_removed_cleanly() -> None:
    pauses = GcPauses().install()
    try:
        gc.collect(0)
        gc.collect()  # a full collection: generation 2
    finally:
        pauses.remove()
    snap = pauses.snapshot()
    assert snap["collections"][0] >= 1 and snap["collections"][2] >= 1
    assert snap["pause_total_s"][2] > 0 and snap["pause_max_s"][2] <= snap["pause_total_s"][2]
    assert pauses not in gc.callbacks
    gc.collect()  # not counted once removed
    assert pauses.snapshot()["collections"] == snap["collections"]


def test_freeze_moves_live_objects_out_of_collections() -> None:
    kept = [[i] for i in range(5000)]  # long-lived, as a loaded model's objects are
    try:
        frozen = freeze_loaded()
        assert frozen >= len(kept) and gc.get_freeze_count() == frozen
        assert all(o is not kept[0] for o in gc.get_objects(2))  # out of the oldest generation
    finally:
        gc.unfreeze()  # this test process goes on; leave the collector as it was
