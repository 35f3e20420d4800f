"""A decode step's stage laps, exact and cheap: CUDA events on a GPU, the host clock on a CPU.

A lap marks the end of a stage. On a GPU it records an event on the engine's stream instead of
synchronising: the GPU stamps it when it gets there, i.e. when the stage's work is done AND the
host has queued the mark (the GPU idles while the host works). So a stage's time is the time
from the previous mark to its own on the step's critical path, host work and GPU work alike, and
the stages add up to the step (the first mark is taken with the GPU idle, at the step's start,
and `finish` synchronises once). The host no longer waits at every stage boundary: a stage's
GPU work overlaps the next stage's host work, as it does in a service that does not time its
stages. A step used to synchronise at each of its six laps; now it waits only where the host
reads the GPU's results (the tree stage's and the accept's copies back) and once at the end.
"""

from __future__ import annotations

import time

import torch


class StageClock:
    def __init__(self, stream: torch.cuda.Stream | None) -> None:
        self.stream = stream
        self.names: list[str] = []
        self.excluded: dict[str, float] = {}  # seconds inside a stage that are not its own
        if stream is None:
            self.marks: list = [time.perf_counter()]
        else:
            self.marks = [self._event()]

    def _event(self) -> torch.cuda.Event:
        e = torch.cuda.Event(enable_timing=True)
        e.record(self.stream)
        return e

    def lap(self, stage: str) -> None:
        """The stage that ends now."""
        self.names.append(stage)
        self.marks.append(time.perf_counter() if self.stream is None else self._event())

    def exclude(self, stage: str, seconds: float) -> None:
        """Time inside `stage` that is not its own (a shadow's candidate run beside it,
        engine.shadow): taken out of the stage's time at `finish`."""
        self.excluded[stage] = self.excluded.get(stage, 0.0) + seconds

    def finish(self) -> dict[str, float]:
        """Seconds per stage (after one synchronisation on a GPU)."""
        m = self.marks
        if self.stream is None:
            out = {n: m[i + 1] - m[i] for i, n in enumerate(self.names)}
        else:
            m[-1].synchronize()  # the last mark: every stage's work is done
            out = {n: m[i].elapsed_time(m[i + 1]) / 1000.0 for i, n in enumerate(self.names)}
        for n, s in self.excluded.items():
            if n in out:
                out[n] = max(out[n] - s, 0.0)
        return out
