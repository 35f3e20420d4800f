"""Step statistics: per-stage timings kept per batch size, accept lengths, Prometheus histograms."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

from checks.vocabulary import STAGES

# stages measured inside another (attention inside the forward of verify): not added on top
NESTED_STAGES = {"attention": "verify"}
STAGE_BUCKETS = (
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
ACCEPT_BUCKETS = tuple(float(i) for i in range(1, 34))


class Histogram:
    """Cumulative bucket counts, sum and count of one series (engine/metrics.py exposes them)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def snapshot(self) -> tuple[list[tuple[float, int]], float]:
        """([(upper bound, cumulative count)], ending with +inf; sum). Caller holds the lock."""
        bounds = list(zip(self.buckets, self.counts, strict=True))
        return [*bounds, (float("inf"), self.count)], self.sum


class StepStats:
    """Thread-safe aggregate of decode steps (written by the scheduler, read by the server)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # batch size -> stage -> [count, total seconds]
        self.by_batch: dict[int, dict[str, list[float]]] = defaultdict(
            lambda: {s: [0, 0.0] for s in (*STAGES, "step")}
        )
        self.steps_by_batch: dict[int, int] = defaultdict(int)
        # batch size -> Σ over its steps of the batch's length spread (longest sequence -
        # shortest, tokens): how far apart the requests of a step stand (a batch whose
        # sequences straddle the torch attention's length buckets costs it more)
        self.spread_by_batch: dict[int, int] = defaultdict(int)
        self.stage_hist = {s: Histogram(STAGE_BUCKETS) for s in STAGES}
        self.accept_hist = Histogram(ACCEPT_BUCKETS)
        self.tokens_total = 0
        self.requests_total = 0
        self.prefill_tokens_total = 0
        self.prefill_seconds_total = 0.0
        self.prefill_attention_seconds_total = 0.0
        self.max_batch_seen = 0
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) for throughput

    def record_step(
        self,
        batch: int,
        stages: dict[str, float],
        accept_lens: list[int],
        delivered: int,
        spread: int = 0,
    ) -> None:
        """One step: its stage times, tokens committed per request, tokens handed to clients,
        and its sequences' length spread (longest - shortest, tokens, before the step)."""
        now = time.monotonic()
        with self.lock:
            self.steps_by_batch[batch] += 1
            self.spread_by_batch[batch] += spread
            self.max_batch_seen = max(self.max_batch_seen, batch)
            row = self.by_batch[batch]
            for s, sec in stages.items():
                row[s][0] += 1
                row[s][1] += sec
                if s in self.stage_hist:
                    self.stage_hist[s].observe(sec)
            for a in accept_lens:
                self.accept_hist.observe(float(a))
            self.tokens_total += delivered
            self._recent.append((now, delivered))
            while self._recent and now - self._recent[0][0] > 10.0:
                self._recent.popleft()

    def record_prefill(self, tokens: int, seconds: float, attention: float = 0.0) -> None:
        """One request's prefill: prompt tokens, its seconds, the attention inside them."""
        with self.lock:
            self.requests_total += 1
            self.prefill_tokens_total += tokens
            self.prefill_seconds_total += seconds
            self.prefill_attention_seconds_total += attention

    def prefill_breakdown(self) -> dict:
        """{"prefills", "tokens", "total_s": {"prefill", "attention"}}: every prefill so far
        (attention is inside prefill). With `breakdown`'s steps, all the engine's timed work:
        a profile divides their growth over a window by the window's wall time."""
        with self.lock:
            return {
                "prefills": self.requests_total,
                "tokens": self.prefill_tokens_total,
                "total_s": {
                    "prefill": self.prefill_seconds_total,
                    "attention": self.prefill_attention_seconds_total,
                },
            }

    def throughput(self) -> float:
        """Generated tokens per second over the last 10 s (0 when idle)."""
        now = time.monotonic()
        with self.lock:
            recent = [(t, n) for t, n in self._recent if now - t <= 10.0]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(n for _, n in recent) / span

    def avg_accept_length(self) -> float:
        with self.lock:
            h = self.accept_hist
            return h.sum / h.count if h.count else 0.0

    def breakdown(self) -> dict[str, dict]:
        """{batch size: {"steps": n, "mean_s": {stage: mean seconds per step}, "total_s":
        {stage: seconds}, "spread_sum": Σ of the steps' length spreads (tokens)}}."""
        with self.lock:
            out = {}
            for b, row in sorted(self.by_batch.items()):
                n = self.steps_by_batch[b]
                out[str(b)] = {
                    "steps": n,
                    "mean_s": {s: (v[1] / n if n else 0.0) for s, v in row.items()},
                    "total_s": {s: v[1] for s, v in row.items()},
                    "spread_sum": self.spread_by_batch[b],
                }
            return out
