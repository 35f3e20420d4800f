"""A profiler window over the engine's forwards, for diagnosis: where a stage's time goes, kernel
by kernel, inside a serving process or a bench alike (`DDTREE_ENGINE_TRACE=DIR`).

    DDTREE_ENGINE_TRACE=DIR [DDTREE_ENGINE_TRACE_ROWS=R1,R2,...] [DDTREE_ENGINE_TRACE_SKIP=S]
        [DDTREE_ENGINE_TRACE_FORWARDS=N] [DDTREE_ENGINE_TRACE_CPU=1]  python -m engine ...

One window per row count R (a decode step of B requests has B * (budget + 1) rows, a prefill
block up to the forward's capacity); with ROWS unset (or 0) one window over forwards of any
size. A window opens at the (S+1)-th forward of its row count (S defaults to 8, so a service's
first requests pass untraced) and holds N forwards of that row count (default 24), recording
every other forward that runs meanwhile too. It records with torch.profiler: on a GPU every
kernel's start and duration on the GPU's clock (CUPTI) and only that, unless `_CPU=1` (or
true / yes / on) adds the host's ops, which slows the host-heavy torch attention path, so its
gaps are no longer the untraced ones. Each window writes its Chrome trace to
`DIR/trace-<pid>-rows<R>.json.gz` (`-any` without ROWS; pid: the process that runs the model,
the one `/get_server_info` reports), and the traced forwards' own attention clock (the plan's
host time and the calls' CUDA-event time, as the engine's stage clock counts them) to
`DIR/trace-<pid>-rows<R>.timers.json`, one entry per forward in order. Windows open one at a
time, in the order their forwards come; a row count's forwards are counted only while no
window is open. A window still open when the process exits is closed and written then, with
the forwards it got. torch prints a line or two of its own when a window opens and closes.

Each traced forward is marked on the GPU's timeline by a host-to-device copy of an odd number
of bytes, `65536 + 4 * rows + 1` (torch attention) or `+ 3` (cuda), before its plan: the
engine's other copies are whole int32 / int64 / float arrays, or small. So a trace alone says
where each forward starts, how many rows it had and which backend ran it;
`benchmarks/attn_trace.py` reads it. The copy costs a few microseconds with the GPU idle (the
forward's own input copy waits for the GPU anyway).

Without the variable nothing here runs. A bad setting (or a DIR that is not a writable
directory) is exit 2 in one line from `python -m engine` and `engine.attn_bench` before
anything runs (`settings`); at run time a trace that cannot be written is one line on stderr
and tracing goes on: a diagnosis never stops the engine it watches.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
import sys
import threading
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
    is empty), each opened at the (skip+1)-th forward of its row count and holding `forwards`
    of them. One window is open at a time and records every forward that runs meanwhile; a row
    count's forwards are counted only while no other window is open."""

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
        self.device: Any = None
        self.thread = 0
        self._exit_hook = False

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
        self.active, self.recorded, self.timers, self.device = target, 0, [], device
        self.thread = threading.get_ident()  # the profiler is closed from the thread that opened it
        try:
            self.prof = profile(activities=acts)
            self.prof.__enter__()
            if not self._exit_hook:  # a window left open at exit crashes torch: close it
                atexit.register(self.close)
                self._exit_hook = True
        except Exception as exc:  # a diagnosis must never break the forward it watches
            print(f"engine.trace: profiler not started ({exc!r}); tracing off", file=sys.stderr)
            self.pending, self.active, self.prof = [], None, None

    def close(self) -> None:
        """Close and write the open window, if any, with the forwards it got so far: from the
        thread that runs the forwards (a service's scheduler at shutdown), or at exit."""
        if self.active is None or self.prof is None:
            return
        if threading.get_ident() != self.thread:  # torch's profiler is not to be closed here
            print(f"engine.trace: window {self._tag(self.active)} left open by its thread, "
                  "not written", file=sys.stderr)  # fmt: skip
            return
        self._stop(self.device)

    def _tag(self, target: int | None) -> str:
        return f"rows{target}" if target else "any"

    def _stop(self, device: torch.device) -> None:
        target = self.active
        try:
            self._write(device)
        except Exception as exc:  # e.g. DIR not writable: say so, never break the forward
            print(f"engine.trace: window {self._tag(target)} not written to {self.out_dir} "
                  f"({exc!r})", file=sys.stderr)  # fmt: skip
        if target in self.pending:
            self.pending.remove(target)
        self.active, self.prof = None, None

    def _write(self, device: torch.device) -> None:
        if device.type == "cuda":
            import torch

            torch.cuda.synchronize(device)
        self.prof.__exit__(None, None, None)
        os.makedirs(self.out_dir, exist_ok=True)
        base = os.path.join(self.out_dir, f"trace-{os.getpid()}-{self._tag(self.active)}.json")
        self.prof.export_chrome_trace(base)
        with open(base, "rb") as src, gzip.open(base + ".gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        os.remove(base)
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


def close() -> None:
    """Close the process's open window, if any (engine.scheduler calls it as its loop ends)."""
    if _tracer is not None:
        _tracer.close()


def tracer() -> Tracer | None:
    """The process's tracer from the environment (read once), or None."""
    global _tracer, _read
    if not _read:
        _read = True
        if os.environ.get(ENV):
            try:
                _tracer = Tracer(**settings(os.environ, check_dir=False))
            except ValueError as exc:  # a diagnosis's bad setting never stops the engine
                print(f"engine.trace: {exc}; tracing off", file=sys.stderr)
    return _tracer


LIMIT = 1_000_000  # the most forwards a setting can name (a window that long is no window)
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "", "false", "no", "off")


def settings(environ: Mapping[str, str], check_dir: bool = True) -> dict[str, Any]:
    """The tracer's settings from the environment ({} when DDTREE_ENGINE_TRACE is unset or
    empty); ValueError naming the variable for a bad one (`python -m engine` and
    `engine.attn_bench` check them before anything runs). With `check_dir`, DIR must be a
    writable directory or one that can be made (its nearest existing parent writable)."""
    out = environ.get(ENV, "")
    if out == "":
        return {}
    if not out.strip():
        raise ValueError(f"${ENV}={out!r}: expected a directory")

    def count(name: str, default: str, low: int) -> int:
        raw = environ.get(name, default).strip()
        if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= LIMIT:
            raise ValueError(f"${name}={environ.get(name)!r}: expected an integer "
                             f"from {low} to {LIMIT}")  # fmt: skip
        return int(raw)

    raw = environ.get(ENV + "_ROWS", "")
    parts = [r.strip() for r in raw.split(",") if r.strip()]
    if not all(r.isascii() and r.isdigit() and int(r) <= LIMIT for r in parts):
        raise ValueError(f"${ENV}_ROWS={raw!r}: expected row counts, e.g. 17,544")
    cpu = environ.get(ENV + "_CPU", "0").strip().lower()
    if cpu not in _ON + _OFF:
        raise ValueError(f"${ENV}_CPU={environ.get(ENV + '_CPU')!r}: expected 1 or 0")
    if check_dir:
        _check_dir(out)
    return {
        "out_dir": out, "rows": tuple(int(r) for r in parts if int(r) != 0),
        "skip": count(ENV + "_SKIP", "8", 0), "forwards": count(ENV + "_FORWARDS", "24", 1),
        "cpu": cpu in _ON,
    }  # fmt: skip


def _check_dir(out: str) -> None:
    """ValueError unless `out` is a writable directory, or can be made as one."""
    path = os.path.abspath(out)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"${ENV}={out!r}: exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"${ENV}={out!r}: directory not writable")
        return
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"${ENV}={out!r}: cannot be made ({parent} is not a writable directory)")
