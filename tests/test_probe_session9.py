"""Session 9's changes probed as a reviewer: the garbage collector's pause counters must never
wedge the process that reads them (a collection started while `/get_server_info` held the
counters' lock re-entered the gc callback on the same thread, which waited on that lock for
ever), and a playbook's `change.shape` refuses true/false as every other number field does
(`--set change.shape.B=true` was a quiet B = 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO

from ops.rollout.playbook import PlaybookError
from ops.rollout.playbook_load import load_playbook

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


@pytest.mark.parametrize("value", ["true", "false"])
def test_change_shape_refuses_true_false_from_set(value: str) -> None:
    with pytest.raises(PlaybookError, match="shape.*takes a number, not true/false"):
        load_playbook("rollout-attention", [f"change.shape.B={value}"])


def test_change_shape_still_takes_numbers_and_strings() -> None:
    pb = load_playbook("rollout-attention", ["change.shape.B=8", "change.shape.dtype=fp32"])
    assert pb.change is not None
    assert pb.change.shape == {"T": 17, "L": 1024, "B": 8, "dtype": "fp32"}
