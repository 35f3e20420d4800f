"""Continuous-batching scheduler: one background thread runs decode steps over the running set.

Requests are submitted through a thread-safe queue; between two steps the scheduler admits
waiting requests (prefill) up to the max batch size and retires finished ones, so requests
join and leave while others decode. Admission is fair between groups (one group per HTTP
request: its prompts): a free slot goes to the waiting group with the fewest running
sequences, ties to the one served least recently, so a request with many prompts never
starves another client's small one. Cancelled requests leave the waiting queue and the
running batch at the next iteration. Each request's updates (new token ids, finish reason) go
to its `sink` callable. The updates of one loop iteration leave together, through `dispatch`:
by default each sink is called on the scheduler thread; the server passes one
`loop.call_soon_threadsafe` per iteration, so the asyncio thread wakes once per step, not once
per request (every wake-up takes the GIL from the step's host-side work). A failure inside a
step fails the requests in that step with an error and the thread keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Hashable

from engine.decode import Decoder
from engine.requests import Dispatch, GenRequest, Sink, Update, deliver
from engine.stats import StepStats

__all__ = ["Dispatch", "GenRequest", "Scheduler", "Sink", "Update", "deliver"]

log = logging.getLogger("engine.scheduler")


class Scheduler:
    def __init__(
        self, decoder: Decoder, stats: StepStats | None = None, dispatch: Dispatch = deliver
    ) -> None:
        self.decoder = decoder
        self.stats = stats or StepStats()
        self.dispatch = dispatch  # takes one iteration's (sink, update) pairs at once
        self._outbox: list[tuple[Sink, Update]] = []
        self.max_batch = decoder.cfg.max_batch_size
        # waiting requests per group; when each group was last served (a tick count)
        self._waiting: dict[Hashable, deque[GenRequest]] = {}
        self._served: dict[Hashable, int] = {}
        self._ticks = 0
        self._n_waiting = 0
        self._running: list[GenRequest] = []
        self._running_per_group: Counter[Hashable] = Counter()
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)

    # -- public (any thread) ------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=10)

    def submit(self, req: GenRequest) -> None:
        with self._cv:
            self._waiting.setdefault(req.key, deque()).append(req)
            self._n_waiting += 1
            self._cv.notify_all()

    def cancel(self, req: GenRequest) -> None:
        req.cancelled = True
        with self._cv:
            self._cv.notify_all()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._n_waiting

    # -- the loop (scheduler thread) --------------------------------------------------------
    def _finish(self, req: GenRequest, update: Update) -> None:
        if req.seq is not None:
            req.seq.blocks.free()
            req.seq = None
        self._emit(req, update)

    def _retire(self, req: GenRequest, update: Update) -> None:
        """Take a running request out of the batch and finish it."""
        self._running.remove(req)
        self._running_per_group[req.key] -= 1
        if self._running_per_group[req.key] <= 0:
            del self._running_per_group[req.key]
        self._finish(req, update)

    def _emit(self, req: GenRequest, update: Update) -> None:
        self._outbox.append((req.sink, update))

    def _flush(self) -> None:
        """Hand this iteration's updates to `dispatch`, all at once."""
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        try:
            self.dispatch(batch)
        except Exception:  # e.g. the server's event loop already closed at shutdown
            log.exception("update dispatch failed")

    def _next_waiting(self) -> GenRequest | None:
        """Pop the next request to admit: from the group with the fewest running sequences,
        ties to the group served least recently (never before first, then by arrival)."""
        with self._cv:
            if not self._waiting:
                return None
            key = min(
                self._waiting,
                key=lambda k: (self._running_per_group[k], self._served.get(k, -1)),
            )
            queue = self._waiting[key]
            req = queue.popleft()
            self._ticks += 1
            self._served[key] = self._ticks
            if not queue:
                del self._waiting[key], self._served[key]
            self._n_waiting -= 1
            return req

    def _drop_cancelled_waiting(self) -> None:
        with self._cv:
            gone = [r for q in self._waiting.values() for r in q if r.cancelled]
            if not gone:
                return
            for key in list(self._waiting):
                kept = deque(r for r in self._waiting[key] if not r.cancelled)
                if kept:
                    self._waiting[key] = kept
                else:
                    del self._waiting[key]
                    self._served.pop(key, None)
            self._n_waiting -= len(gone)
        for req in gone:
            self._finish(req, Update([], True, "abort"))

    def _admit(self) -> None:
        while len(self._running) < self.max_batch:
            req = self._next_waiting()
            if req is None:
                return
            if req.cancelled:
                self._finish(req, Update([], True, "abort"))
                continue
            vocab = self.decoder.model.cfg.vocab_size
            if not req.prompt_ids or any(not 0 <= t < vocab for t in req.prompt_ids):
                self._finish(req, Update([], True, "error", f"prompt ids must lie in [0, {vocab})"))
                continue
            try:
                t0 = time.perf_counter()
                req.seq = self.decoder.new_sequence(req.prompt_ids, req.temperature, req.seed)
                attention = self.decoder.prefill(req.seq)
                self.stats.record_prefill(len(req.prompt_ids), time.perf_counter() - t0, attention)
                self._running.append(req)
                self._running_per_group[req.key] += 1
            except Exception as exc:
                log.exception("prefill failed")
                self._finish(req, Update([], True, "error", f"prefill failed: {exc}"))

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not self._running:
                    self._cv.wait(timeout=1.0)
                if self._stop:
                    break
            try:
                self._iteration()
            except Exception as exc:  # never let the loop die: fail this batch, go on
                log.error("scheduler iteration failed:\n%s", traceback.format_exc())
                for req in list(self._running):
                    self._retire(req, Update([], True, "error", f"decode step failed: {exc}"))
            finally:
                self._flush()
        with self._cv:
            waiting = [r for q in self._waiting.values() for r in q]
            self._waiting.clear()
            self._served.clear()
            self._n_waiting = 0
        for req in [*self._running, *waiting]:
            self._finish(req, Update([], True, "abort", "server shutting down"))
        self._flush()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _iteration(self) -> None:
        """Retire cancelled requests, admit waiting ones, run one step, hand out its tokens."""
        for req in [r for r in self._running if r.cancelled]:
            self._retire(req, Update([], True, "abort"))
        self._drop_cancelled_waiting()
        self._admit()
        if not self._running:
            return
        batch = list(self._running)
        lengths = [len(r.seq.tokens) for r in batch]
        t0 = time.perf_counter()
        res = self.decoder.step([r.seq for r in batch])
        res.stages["step"] = time.perf_counter() - t0
        delivered = 0
        for req, new in zip(batch, res.new_tokens, strict=True):
            update = req.take(new)
            delivered += len(update.token_ids)
            if update.finished:
                self._retire(req, update)
            elif update.token_ids:
                self._emit(req, update)
        self.stats.record_step(
            len(batch),
            res.stages,
            [len(n) for n in res.new_tokens],
            delivered,
            max(lengths) - min(lengths),
        )
