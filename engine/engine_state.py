"""The engine in this process, as the HTTP app's engine handle: load, schedule, report.

`EngineState` builds the decoder in a background thread (what loading built is frozen out of
later garbage collections), runs the continuous-batching scheduler, and answers the app's
calls: `submit` / `cancel`, `info()` (`/get_server_info`: config, backends, limits, pid, the
collector's counters, the step-time breakdown) and `metrics()` (Prometheus text). One
scheduler iteration's updates reach the event loop through one `loop.call_soon_threadsafe`.
With `--frontend process` the same object serves the front end's pipe instead
(`engine.engine_proc.serve_engine`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from engine import metrics
from engine.components import resolve_backends
from engine.config import Preset, to_dict
from engine.gc_pauses import GcPauses, freeze_loaded
from engine.limits import Limits
from engine.runtime import EngineSpec, build_decoder
from engine.scheduler import Dispatch, GenRequest, Scheduler, Sink, Update, deliver
from engine.stats import NESTED_STAGES, StepStats
from engine.tokenizer import ByteTokenizer

log = logging.getLogger("engine.server")


class EngineState:
    """The engine in this process: the spec, and once loaded the preset and the scheduler.

    It is also what the endpoints talk to (the engine handle): `ready`, `load_error`,
    `preset`, `alive()`, `submit` / `cancel`, `info()` / `metrics()`, `start(loop)` / `stop()`.
    `engine.engine_proc.EngineClient` is the same handle for an engine in another process."""

    frontend = "thread"  # the HTTP server runs beside the scheduler, in this process

    def __init__(
        self,
        spec: EngineSpec,
        model_name: str,
        load_delay: float = 0.0,
        limits: Limits | None = None,
    ) -> None:
        self.spec, self.model_name, self.load_delay = spec, model_name, load_delay
        self.limits = limits or Limits()
        self.backend_sources = (
            spec.backend_sources or resolve_backends(None, list(spec.backends), "cuda")[1]
        )
        self.tok = ByteTokenizer()
        self.stats = StepStats()
        self.preset: Preset | None = None
        self.scheduler: Scheduler | None = None
        self.load_error: str | None = None
        self.created = int(time.time())
        self.ready = threading.Event()
        self.gc = GcPauses()  # installed while the engine runs
        # what to do when loading fails (python -m engine: stop serving and exit 1, so a
        # service manager sees the failure at once instead of a process that never gets ready)
        self.on_load_failed: Callable[[], None] = lambda: None

    def load(self, dispatch: Dispatch) -> None:
        """Build the model and start the scheduler, its updates handed to `dispatch`."""
        try:
            time.sleep(self.load_delay)
            self.preset, decoder = build_decoder(self.spec)
            # what loading built lives as long as the process: out of every later collection
            freeze_loaded()
            self.scheduler = Scheduler(decoder, self.stats, dispatch)
            self.scheduler.start()
            self.ready.set()
            log.info("engine ready: preset=%s mode=%s", self.spec.preset, self.spec.mode)
        except Exception as exc:  # reported by /health until the process stops
            log.exception("engine failed to load")
            self.load_error = f"{type(exc).__name__}: {exc}"
            self.on_load_failed()

    # -- the engine handle --------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self.spec.mode

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load in a background thread; one step's updates come back on `loop` at once."""

        def dispatch(batch: list[tuple[Sink, Update]]) -> None:
            loop.call_soon_threadsafe(deliver, batch)

        self.gc.install()
        threading.Thread(
            target=self.load, args=(dispatch,), name="engine-load", daemon=True
        ).start()

    def stop(self) -> None:
        self.gc.remove()
        if self.scheduler is not None:
            self.scheduler.shutdown()

    def alive(self) -> bool:
        return self.scheduler is not None and self.scheduler.alive

    def submit(self, req: GenRequest) -> None:
        assert self.scheduler is not None
        self.scheduler.submit(req)

    def cancel(self, req: GenRequest) -> None:
        if self.scheduler is not None:
            self.scheduler.cancel(req)  # no-op once finished

    async def info(self) -> dict[str, Any]:
        return self.info_doc()

    async def metrics(self) -> str:
        return self.metrics_text()

    async def shadow(self, body: Any) -> dict[str, Any]:
        return self.shadow_call(body)

    def shadow_call(self, body: Any) -> dict[str, Any]:
        """`POST /shadow` (engine.shadow): arm or disarm; the shadow's doc, or {"error": why}
        for a request it refuses (the front end's 400)."""
        sched = self.scheduler
        if sched is None or not self.ready.is_set():
            return {"error": "the engine is not serving yet", "status": 503}
        try:
            return sched.decoder.shadow.arm(body)
        except ValueError as e:
            return {"error": str(e), "status": 400}

    def info_doc(self) -> dict[str, Any]:
        """`/get_server_info`: the config, backends, limits, pid and the scheduler's counters."""
        s, spec, sched = self.stats, self.spec, self.scheduler
        internal = {
            "avg_spec_accept_length": s.avg_accept_length(),
            "last_gen_throughput": s.throughput(),
            "num_running_reqs": sched.num_running if sched else 0,
            "num_waiting_reqs": sched.num_waiting if sched else 0,
            "max_batch_size_seen": s.max_batch_seen,
            "generation_tokens_total": s.tokens_total,
            "requests_total": s.requests_total,
            "step_time_breakdown": s.breakdown(),
            "prefill_time_breakdown": s.prefill_breakdown(),
            "clock_s": time.monotonic(),
        }
        dec = sched.decoder if sched else None
        return {
            "model": self.model_name,
            "pid": os.getpid(),  # the process that holds the model (and the GPU)
            "frontend": self.frontend,
            "ready": self.ready.is_set(),
            "preset": spec.preset,
            "mode": spec.mode,
            "device": spec.device,
            "config": to_dict(self.preset) if self.preset else None,
            "backends": dec.backends.names if dec else None,
            "backend_sources": self.backend_sources,
            "limits": dataclasses.asdict(self.limits),
            "topk": dec.k if dec else None,
            # the tree budget a step of b requests builds (EngineConfig.budget_at), b = 1..max
            "budget_by_batch": (
                [dec.cfg.budget_at(b) for b in range(1, dec.cfg.max_batch_size + 1)]
                if dec and spec.mode == "ddtree"
                else None
            ),
            "cuda_graphs": {
                "enabled": dec.forward.graphs,
                "captured": dec.forward.captured_graphs,
                "row_chunk": dec.forward.chunk,
            }
            if dec
            else None,
            "matmul": spec.matmul if spec.device.startswith("cuda") else "fp32",
            # the garbage collector: runs and pauses per generation since start, and how
            # many objects loading left frozen (engine.gc_pauses)
            "gc": self.gc.snapshot(),
            "nested_stages": NESTED_STAGES,
            # engine.shadow: a candidate (attention, tree_build) timed beside the serving backend
            # on the service's own forwards or steps (POST /shadow)
            "shadow": dec.shadow.doc() if dec else None,
            "internal_states": [internal],
        }

    def metrics_text(self) -> str:
        sched = self.scheduler
        return metrics.render(
            self.stats,
            self.model_name,
            sched.num_running if sched else 0,
            sched.num_waiting if sched else 0,
        )
