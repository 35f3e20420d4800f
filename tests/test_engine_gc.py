"""engine.gc_pauses: the collector's runs are counted and timed, and loading's objects frozen; a
collection that starts inside `snapshot()` (under its lock, on the same thread) does not wedge
the process."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
from helpers import REPO

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


# every container allocation starts a collection: one happens inside snapshot()'s lock
SNAPSHOT_UNDER_COLLECTIONS = """
import gc
from engine.gc_pauses import GcPauses
pauses = GcPauses().install()
gc.set_threshold(1)
for _ in range(200):
    snap = pauses.snapshot()
gc.set_threshold(700)
pauses.remove()
assert sum(snap["collections"]) > 0, snap
print("ok")
"""


def test_gc_snapshot_survives_a_collection_inside_it() -> None:
    """A collection can start on any allocation; snapshot() allocates under its lock, and the
    gc callback runs on that same thread: with a plain Lock that is a deadlock of the
    engine's HTTP loop (then of every thread that collects)."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", SNAPSHOT_UNDER_COLLECTIONS],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("GcPauses.snapshot() deadlocked when a collection started inside it")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
