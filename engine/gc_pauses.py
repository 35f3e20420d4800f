"""The Python garbage collector in a serving process: freeze what loading built, count pauses.

A loaded engine holds many long-lived objects (modules, tensors, graphs, configs). Every
collection of the oldest generation walks all of them, on whichever thread happened to
allocate, and holds the GIL while it does: a pause in the middle of a decode step or of the
HTTP loop. `freeze_loaded()` moves everything alive after loading into the permanent
generation (`gc.freeze`), so later collections only walk what serving allocates (as SGLang does
after warm-up). `GcPauses` times every collection through `gc.callbacks`, so
`/get_server_info` shows how often the collector ran and how long it held the process.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any


def freeze_loaded() -> int:
    """Collect once, then freeze every object still alive; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Counts and times the collector's runs per generation (a `gc.callbacks` hook)."""

    def __init__(self) -> None:
        # re-entrant: a collection can start on any allocation, snapshot()'s included, and
        # runs this callback on the same thread while snapshot() holds the lock
        self._lock = threading.RLock()
        self._t0: float | None = None
        self.count = [0, 0, 0]
        self.total_s = [0.0, 0.0, 0.0]
        self.max_s = [0.0, 0.0, 0.0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self._t0 is None:
            return
        dt, self._t0 = time.perf_counter() - self._t0, None
        g = min(max(int(info.get("generation", 0)), 0), 2)
        with self._lock:
            self.count[g] += 1
            self.total_s[g] += dt
            self.max_s[g] = max(self.max_s[g], dt)

    def install(self) -> GcPauses:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "collections": list(self.count),
                "pause_total_s": [round(x, 6) for x in self.total_s],
                "pause_max_s": [round(x, 6) for x in self.max_s],
                "frozen_objects": gc.get_freeze_count(),
                "thresholds": list(gc.get_threshold()),
            }
