"""A profiler window over the engine's forwards, for diagnosis: where a stage's time goes, kernel
by kernel, inside a serving process or a bench alike (`DDTREE_ENGINE_TRACE=DIR`).

    DDTREE_ENGINE_TRACE=DIR [DDTREE_ENGINE_TRACE_ROWS=R1,R2,...] [DDTREE_ENGINE_TRACE_SKIP=S]
        [DDTREE_ENGINE_TRACE_FORWARDS=N] [DDTREE_ENGINE_TRACE_CPU=1]  python -m engine ...

One window per row count R (a decode step of B requests has B * (budget + 1) rows, a prefill
block up to the forward's capacity; one window over any forwards when ROWS is unset): it opens
at the (S+1)-th forward of R rows (S defaults to 8, so a service's first requests pass
untraced) and closes after N more (default 24), recording every forward that runs meanwhile
with torch.profiler: on a GPU every kernel's start and duration on the GPU's clock (CUPTI) and
only that, unless `_CPU=1` adds the host's ops (which slows the host-heavy torch attention
path, so its gaps are no longer the untraced ones). Each window writes its Chrome trace to
`DIR/trace-<pid>-rows<R>.json.gz`, and the traced forwards' own attention clock (the plan's
host time and the calls' CUDA-event time, as the engine's stage clock counts them) to
`DIR/trace-<pid>-rows<R>.timers.json`, one entry per forward in order. Windows open one at a
time, in the order their forwards come; a row count's forwards are counted only while no
window is open.

Each traced forward is marked on the GPU's timeline by a host-to-device copy of an odd number
of bytes, `65536 + 4 * rows + 1` (torch attention) or `+ 3` (cuda), before its plan: the
engine's other copies are whole int32 / int64 / float arrays, or small. So a trace alone says
where each forward starts, how many rows it had and which backend ran it;
`benchmarks/attn_trace.py` reads it. The copy costs a few microseconds with the GPU idle (the
forward's own input copy waits for the GPU anyway). Without the variable nothing here runs.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ENV = "DDTREE_ENGINE_TRACE"


MARK_BASE = 1 << 16


def marker_bytes(rows: int, impl: str) -> int:
    """The marker copy's size for a forward of `rows` rows under attention `impl`."""
    return MARK_BASE + 4 * rows + (3 if impl == "cuda" else 1)


def read_marker(nbytes: int) -> tuple[int, str] | None:
    """(rows, impl) from a copy's size, or None when the copy is not a marker."""
    if nbytes <= MARK_BASE or nbytes % 2 == 0:
        return None
    return (nbytes - MARK_BASE) // 4, ("cuda" if nbytes % 4 == 3 else "torch")


class Tracer:
    """Windows over forwards: one per row count in `rows` (or one over any forwards when `rows`
    is empty), each opened at the (skip+1)-th forward of its row count and closed after
    `forwards` more of them. One window is open at a time and records every forward that runs
    meanwhile; a row count's forwards are counted only while no other window is open."""

    def __init__(
        self, out_dir: str, rows: tuple[int, ...] = (), skip: int = 8, forwards: int = 24,
        cpu: bool = False,
    ) -> None:  # fmt: skip
        if skip < 0 or forwards < 1 or any(r < 1 for r in rows):
            raise ValueError(f"{ENV}: skip >= 0, forwards >= 1 and rows >= 1 are needed")
        self.out_dir, self.skip, self.forwards, self.cpu = out_dir, skip, forwards, cpu
        self.pending: list[int] = list(dict.fromkeys(rows)) or [0]  # 0: any forward
        self.seen = dict.fromkeys(self.pending, 0)
        self.active: int | None = None  # the open window's row count
        self.recorded = 0
        self.prof: Any = None
        self.timers: list[tuple] = []  # (rows, impl, timer, host_s, spans) before and after
        self._at: tuple[float, int] | None = None
        self.paths: list[str] = []

    def _target(self, rows: int) -> int | None:
        if 0 in self.pending:
            return 0
        return rows if rows in self.pending else None

    def before(self, rows: int, impl: str, device: torch.device, timer: Any = None) -> None:
        """Called at a forward's start: opens a window when one is due, marks the forward."""
        if self.active is None:
            t = self._target(rows)
            if t is None:
                return
            self.seen[t] += 1
            if self.seen[t] <= self.skip:
                return
            self._start(t, device)
        if device.type == "cuda":
            import torch

            torch.empty(marker_bytes(rows, impl), dtype=torch.uint8).to(device)
        # where this forward's share of its timer starts (a prefill's blocks share one)
        self._at = (timer.host_s, len(timer.spans)) if timer is not None else None

    def after(self, rows: int, impl: str, device: torch.device, timer: Any = None) -> None:
        """Called at a forward's end: closes the window after its `forwards` forwards. The
        forward's AttentionTimer (if any) is kept, and read once the window closes: its plan's
        host seconds and its calls' CUDA-event seconds, per traced forward, in order, go to
        the trace's `.timers.json` beside it."""
        if self.active is None:
            return
        if timer is not None and self._at is not None:
            self.timers.append((rows, impl, timer, *self._at, timer.host_s, len(timer.spans)))
        if self.active in (0, rows):
            self.recorded += 1
        if self.recorded >= self.forwards:
            self._stop(device)

    def _start(self, target: int, device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CUDA] if device.type == "cuda" else []
        if self.cpu or device.type != "cuda":
            acts.append(ProfilerActivity.CPU)
        self.active, self.recorded, self.timers = target, 0, []
        try:
            self.prof = profile(activities=acts)
            self.prof.__enter__()
        except Exception as exc:  # a diagnosis must never break the forward it watches
            print(f"engine.trace: profiler not started ({exc!r}); tracing off", file=sys.stderr)
            self.pending, self.active, self.prof = [], None, None

    def _stop(self, device: torch.device) -> None:
        target = self.active
        try:
            self._write(device)
        except Exception as exc:  # e.g. DIR not writable: say so, never break the forward
            print(f"engine.trace: window rows={target} not written ({exc!r})", file=sys.stderr)
        if target in self.pending:
            self.pending.remove(target)
        self.active, self.prof = None, None

    def _write(self, device: torch.device) -> None:
        if device.type == "cuda":
            import torch

            torch.cuda.synchronize(device)
        self.prof.__exit__(None, None, None)
        os.makedirs(self.out_dir, exist_ok=True)
        tag = f"rows{self.active}" if self.active else "any"
        base = os.path.join(self.out_dir, f"trace-{os.getpid()}-{tag}.json")
        self.prof.export_chrome_trace(base)
        with open(base, "rb") as src, gzip.open(base + ".gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        os.remove(base)
        self.paths.append(base + ".gz")
        timed = []
        for rows, impl, t, h0, n0, h1, n1 in self.timers:
            spans = t.spans[n0:n1]
            calls = sum(s.elapsed_time(e) * 1e3 for s, e in spans) if t.cuda else sum(
                1e6 * s[0] for s in spans
            )  # fmt: skip
            timed.append({"rows": rows, "impl": impl, "plan_host_us": 1e6 * (h1 - h0),
                          "calls_us": calls})  # fmt: skip
        with open(base[: -len(".json")] + ".timers.json", "w") as f:
            json.dump(timed, f)


_tracer: Tracer | None = None
_read = False


def tracer() -> Tracer | None:
    """The process's tracer from the environment (read once), or None."""
    global _tracer, _read
    if not _read:
        _read = True
        out = os.environ.get(ENV)
        if out:
            try:
                _tracer = Tracer(**settings(os.environ))
            except ValueError as exc:  # a diagnosis's bad setting never stops the engine
                print(f"engine.trace: {exc}; tracing off", file=sys.stderr)
    return _tracer


def settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The tracer's settings from the environment ({} when DDTREE_ENGINE_TRACE is unset);
    ValueError naming the variable for a bad one (`python -m engine` checks them at start)."""
    out = environ.get(ENV)
    if not out:
        return {}

    def num(name: str, default: str) -> int:
        raw = environ.get(name, default)
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"${name}={raw!r}: expected an integer") from None

    raw = environ.get(ENV + "_ROWS", "")
    try:
        rows = tuple(int(r) for r in raw.split(",") if r.strip())
    except ValueError:
        raise ValueError(f"${ENV}_ROWS={raw!r}: expected row counts, e.g. 17,544") from None
    doc = {
        "out_dir": out, "rows": tuple(r for r in rows if r != 0),
        "skip": num(ENV + "_SKIP", "8"), "forwards": num(ENV + "_FORWARDS", "24"),
        "cpu": environ.get(ENV + "_CPU", "0") not in ("0", "", "false", "no"),
    }  # fmt: skip
    if doc["skip"] < 0:
        raise ValueError(f"${ENV}_SKIP={doc['skip']}: expected >= 0")
    if doc["forwards"] < 1:
        raise ValueError(f"${ENV}_FORWARDS={doc['forwards']}: expected >= 1")
    if any(r < 0 for r in rows):
        raise ValueError(f"${ENV}_ROWS={raw!r}: row counts are >= 0")
    return doc
