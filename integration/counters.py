"""The import hook's stage clock: each call of the fork's builder and walk, counted and timed.

One file per process, `<run>/hook-counters/<pid>.bin` (layout: `checks.hook_counters`, which
also reads it), created when the hook patches the fork's module and memory-mapped; a call
updates its words in place through a memoryview (`mv[i] += x`: no I/O, no lock, no
allocation beyond the ints), so the cost per call is two clock reads and two or three stores
(`python -m integration.percall` measures it). Files of processes that are gone are removed
when a new one is created (their numbers went with them; a shadow's saved cases stay).

A forked child (os.fork after the patch) gets a file of its own: its wrappers are rebound to
it (`os.register_at_fork`). A directory that cannot be written leaves the counting in memory
(`Counters.error` says why; the service is not touched). Standard library only.
"""

from __future__ import annotations

import functools
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checks.hook_counters import (
    COUNTERS_DIR,
    SIZE,
    alive,
    field,
    header_words,
    start_ticks,
)


class Counters:
    """This process's counters file (or memory, when it cannot be written), as int64 words."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path: Path | None = None
        self.error: str | None = None
        self._rebinds: list[Callable[[memoryview], None]] = []
        self.mv = self._open()
        os.register_at_fork(after_in_child=self._after_fork)

    def _open(self) -> memoryview:
        pid = os.getpid()
        head = header_words(pid, start_ticks(pid) or 0, time.time_ns())
        try:
            return self._file(pid, head)
        except OSError as exc:
            self.path, self.error = None, f"counters kept in memory: {exc}"
            mv = memoryview(bytearray(SIZE)).cast("q")
            for i, word in enumerate(head):
                mv[i] = word
            return mv

    def _file(self, pid: int, head: list[int]) -> memoryview:
        """A fresh file with its header, in place under its name only once complete."""
        d = self.run_dir / COUNTERS_DIR
        d.mkdir(parents=True, exist_ok=True)
        _prune(d, pid)
        final = d / f"{pid}.bin"
        tmp = d / f".{pid}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        mv = memoryview(mm).cast("q")
        for i, word in enumerate(head):
            mv[i] = word
        os.replace(tmp, final)
        self.path, self.error, self._mm = final, None, mm
        return mv

    def _after_fork(self) -> None:
        self.mv = self._open()
        for rebind in self._rebinds:
            rebind(self.mv)

    def on_rebind(self, rebind: Callable[[memoryview], None]) -> None:
        self._rebinds.append(rebind)

    def set(self, component: str, name: str, value: int) -> None:
        self.mv[field(component, name)] = value

    def get(self, component: str, name: str) -> int:
        return int(self.mv[field(component, name)])


def _prune(d: Path, me: int) -> None:
    """Remove the files of processes that are gone (never this one's, never a live one's)."""
    try:
        names = [n for n in os.listdir(d) if n.endswith(".bin") and n[:-4].isdigit()]
    except OSError:
        return
    for name in names:
        pid = int(name[:-4])
        if pid == me:
            continue
        try:
            with open(d / name, "rb") as f:
                head = memoryview(f.read(32)).cast("q")
            if len(head) == 4 and not alive(int(head[2]), int(head[3])):
                os.unlink(d / name)
        except OSError:
            continue


def timed(fn: Callable, counters: Counters, component: str) -> Callable:
    """`fn` counted and timed in `component`'s words; same signature, attributes and answers."""
    calls, total, errors = (field(component, f) for f in ("calls", "ns", "errors"))
    clock = time.perf_counter_ns
    mv = counters.mv

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            mv[total] += clock() - t0
            mv[calls] += 1
            mv[errors] += 1
            raise
        mv[total] += clock() - t0
        mv[calls] += 1
        return out

    def rebind(new: memoryview) -> None:
        nonlocal mv
        mv = new

    counters.on_rebind(rebind)
    counted.ddtree_ops_counted = component  # type: ignore[attr-defined]
    return counted


__all__ = ["Counters", "timed"]
