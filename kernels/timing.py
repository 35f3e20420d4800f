"""The one timer of the kernel benchmarks (`kernels.bench`): CUDA events, graph replay, host.

Measurement rules: warm up first; time many repetitions and report the median and IQR;
rotate over several input sets so repeated runs don't just measure L2; for launch-bound
kernels also capture `launches` calls in a CUDA graph and report the replay time divided by
the launches. `fn(i)` runs the kernel on input set `i % n_inputs`. Rows whose ratio is the
result (a stage's baseline against its candidate, what `ops report` projects with) take their
samples interleaved (`interleave`: A B B A ...), so a slow spell of the host or a neighbour's
burst on a shared GPU falls on both sides alike instead of on whichever ran at that moment.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Timing",
    "forward_sampler",
    "interleave",
    "summarize",
    "time_cuda",
    "time_graph",
    "time_host",
]


@dataclass
class Timing:
    """Median / quartiles in microseconds over `reps` samples (per launch for graph mode)."""

    median_us: float
    p25_us: float
    p75_us: float
    reps: int
    mode: str  # "events", "graph", "stage" or "host"
    launches_per_sample: int = 1
    samples_us: list[float] = field(default_factory=list)

    @property
    def iqr_us(self) -> float:
        return self.p75_us - self.p25_us

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["iqr_us"] = self.iqr_us
        return d


def summarize(samples_us: Sequence[float], mode: str, launches: int = 1) -> Timing:
    """Median and quartiles (inclusive method) of the samples; needs at least one sample."""
    xs = sorted(float(x) for x in samples_us)
    if not xs:
        raise ValueError("summarize: no samples")
    if len(xs) == 1:
        q1 = q3 = xs[0]
    else:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return Timing(statistics.median(xs), q1, q3, len(xs), mode, launches, list(samples_us))


def time_cuda(
    fn: Callable[[int], Any], n_inputs: int = 1, warmup: int = 5, reps: int = 50
) -> Timing:
    """Each sample: one call between two CUDA events on the current stream."""
    import torch

    for i in range(warmup):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(i % n_inputs)
        end.record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) * 1e3 for s, e in events], "events")


def interleave(samplers: dict[str, Callable[[int], float]], reps: int) -> dict[str, list[float]]:
    """`reps` samples of each sampler, taken in turn: rep r calls them in order when r is even
    and in reverse when odd (A B, B A, A B ...), so drift over the run, linear or a spell of
    any length, weighs on every sampler alike. `sampler(r)` returns one sample (us)."""
    names = list(samplers)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for n in names if r % 2 == 0 else reversed(names):
            out[n].append(float(samplers[n](r)))
    return out


def forward_sampler(
    forwards: Callable[[int], Sequence[tuple[Callable[[], Any], Callable[[Any, int], Any]]]],
    n_inputs: int = 1,
    layers: int = 4,
    piece_us: float = 0.0,
    warmup: int = 3,
    parts: list[tuple[float, float]] | None = None,
) -> Callable[[int], float]:
    """A stage's sampler shaped as the forwards that run it (engine.forward): `forwards(i)`
    gives input set i's forwards, each a (plan, call) pair. Per forward: the GPU idle (the
    forward's input upload waits for the stream), `plan()` on the host clock (the engine's
    `AttentionTimer.host`), then per layer a GPU sleep of `piece_us` (the stand-in for the
    graph piece the forward runs before that layer's call; 0: none) and `call(plan, layer)`
    between two CUDA events (`AttentionTimer.span`). A sample is the host time plus the spans'
    GPU time (us), as the engine's stage clock adds them: where the CPU is still launching a
    call when the GPU gets to it, the wait is inside the span, as it is in the forward; behind
    one long GPU sleep before the calls it would be hidden. With `parts`, each sample also appends
    its (host us, GPU us) there; the `warmup` samples are not kept."""
    import torch

    cycles = 0

    def sample(i: int) -> float:
        host_s, spans = 0.0, []
        for plan, call in forwards(i % n_inputs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            p = plan()
            host_s += time.perf_counter() - t0
            for layer in range(layers):
                if cycles:
                    torch.cuda._sleep(cycles)
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                call(p, layer)
                end.record()
                spans.append((start, end))
        torch.cuda.synchronize()
        host_us = host_s * 1e6
        gpu_us = sum(s.elapsed_time(e) for s, e in spans) * 1e3
        if parts is not None:
            parts.append((host_us, gpu_us))
        return host_us + gpu_us

    for i in range(warmup):
        sample(i % n_inputs)
    if parts is not None:
        parts.clear()
    # the piece's sleep calibrated once the warm-up has the GPU at its working clock (a sleep
    # counts cycles: calibrated at an idle clock it runs several times shorter under load)
    cycles = _sleep_cycles(piece_us * 1e-6) if piece_us > 0 else 0
    return sample


def _sleep_cycles(seconds: float) -> int:
    """torch.cuda._sleep cycles lasting about `seconds` on the current device (measured)."""
    import torch

    probe = 1_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    per_cycle = start.elapsed_time(end) / 1e3 / probe
    return max(1000, int(seconds / max(per_cycle, 1e-12)))


def time_graph(
    fn: Callable[[int], Any], n_inputs: int = 1, launches: int = 32, warmup: int = 3, reps: int = 20
) -> Timing:
    """Capture `launches` calls (rotating inputs) in one CUDA graph; time replays / launches."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(max(warmup, 1)):
            fn(i % n_inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            fn(i % n_inputs)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / launches)
    del graph
    return summarize(samples, "graph", launches)


def time_host(
    fn: Callable[[int], Any], n_inputs: int = 1, warmup: int = 2, reps: int = 20
) -> Timing:
    """Host wall clock (perf_counter) per call, for the CPU baselines."""
    for i in range(warmup):
        fn(i % n_inputs)
    samples = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i % n_inputs)
        samples.append((time.perf_counter() - t0) * 1e6)
    return summarize(samples, "host")
