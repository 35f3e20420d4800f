"""One forward for a whole step: fixed-size row chunks over static buffers, piecewise CUDA graphs.

`Forward.run(rows, attention)` computes the logits of every row of a step (every request's
root and tree nodes, or a block of prompt rows) and writes their KV into the paged pool:

    for each layer:  pre(chunk) for every chunk  ->  attention(all rows)  ->  post(chunk) ...
    then head(chunk) for every chunk

Rows live in static buffers of `max_rows` (a multiple of the chunk size `C`); a forward of R
rows runs ceil(R / C) chunks and pads the last one (token 0 at position 0, its KV written to
the pool's trash slot). Every chunk has the same shapes, so a row's arithmetic does not depend
on the batch (see engine.model).

CUDA graphs, the way SGLang's piecewise capture does it: everything between two attentions
(`post` of layer l-1 and `pre` of layer l, for every chunk of the forward) is captured once per
chunk count, at startup (`capture`), as one graph over the static buffers, and replayed
afterwards: a forward is layers + 1 graph launches. Attention runs eagerly between them with
the step's real lengths, which is also where its time is measured: its plan on the host clock
(built before the first piece, with the GPU idle) and its calls with CUDA events (read after the
step's sync, so the timing costs no extra sync). `graphs=False` (`--no-cuda-graphs`,
DDTREE_ENGINE_CUDA_GRAPHS=0) runs the same segments eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.attention import Attention
from engine.model import Model
from engine.shadow import Pair, Shadow, Taken


@dataclass
class Rows:
    """Rows of one forward: token, RoPE position, KV slot written (host arrays), and the
    visible slots in position order (`table[i, :lens[i]]`: prefix, tree ancestors, itself; a
    host array, or a tensor already on the model's device as engine.decode builds a decode
    step's and a prefill block's on a GPU)."""

    tokens: np.ndarray  # [R] int64
    positions: np.ndarray  # [R] int64
    write_slots: np.ndarray  # [R] int64
    table: np.ndarray | torch.Tensor  # [R, W] int64
    lens: np.ndarray  # [R] int64

    def __len__(self) -> int:
        return len(self.tokens)


class AttentionTimer:
    """Seconds spent in attention during a forward: its plan on the host clock (built with the
    GPU idle, before the forward's first piece, so all of it is on the critical path), then
    every call: CUDA events on a GPU, the clock on the CPU."""

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None = None) -> None:
        self.cuda = device.type == "cuda"
        # the stream the forward runs on: the caller's (a step looks it up once for its laps
        # and this timer), else looked up here once
        if self.cuda and stream is None:
            stream = torch.cuda.current_stream(device.index)
        self.stream = stream
        self.spans: list[tuple] = []
        self.host_s = 0.0

    def host(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.host_s += time.perf_counter() - t0
        return out

    def span(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            out = fn()
            end.record(self.stream)
            self.spans.append((start, end))
        else:
            t0 = time.perf_counter()
            out = fn()
            self.spans.append((time.perf_counter() - t0,))
        return out

    def calls_seconds(self) -> float:
        """The calls alone; call after the device is synchronised."""
        if self.cuda:
            return sum(s.elapsed_time(e) for s, e in self.spans) / 1000.0
        return sum(s[0] for s in self.spans)

    def seconds(self) -> float:
        """Total; call after the device is synchronised."""
        return self.host_s + self.calls_seconds()

    def merge(self, other: AttentionTimer) -> None:
        """Add another timer's plan time and calls (a shadowed forward's serving backend)."""
        self.host_s += other.host_s
        self.spans.extend(other.spans)


class ShadowedCalls:
    """What the engine's shadow sampled (engine.shadow): one forward's attention (both
    backends' plans, then their calls layer by layer) or one step's tree build (one call each,
    no plan), in the order `first` says, each backend on its own timer; the serving backend's
    output is the one returned. A candidate that raises is dropped for the rest of it (and the
    shadow disarmed); the serving backend goes on."""

    def __init__(
        self, shadow: Shadow, taken: Taken, device: torch.device, stream: torch.cuda.Stream | None
    ) -> None:
        self.shadow, self.candidate, self.first = shadow, taken.candidate, taken.first
        self.window = taken.window
        self.base = AttentionTimer(device, stream)
        self.cand = AttentionTimer(device, stream)
        self.cand_plan: Any = None
        self.failed = False

    def _cand(self, fn: Callable[[], Any]) -> None:
        if self.failed:
            return
        try:
            fn()
        except Exception as e:  # the candidate's fault, never the service's
            self.failed = True
            self.shadow.fail(e, self.window)

    def plan(self, make_base: Callable[[], Any], make_cand: Callable[[], Any]) -> Any:
        def cand() -> None:
            self.cand_plan = self.cand.host(make_cand)

        if self.first == "cand":
            self._cand(cand)
        plan = self.base.host(make_base)
        if self.first == "base":
            self._cand(cand)
        return plan

    def call(self, base: Callable[[], torch.Tensor], cand: Callable[[Any], Any]) -> torch.Tensor:
        def run_cand() -> None:
            self.cand.span(lambda: cand(self.cand_plan))

        if self.first == "cand":
            self._cand(run_cand)
        out = self.base.span(base)
        if self.first == "base":
            self._cand(run_cand)
        return out

    def finish(self, kind: str, rows: int, timer: AttentionTimer | None) -> Pair | None:
        """After the last call: one sync, then the pair (None when the candidate failed); the
        serving backend's time goes into the step's own timer as an unsampled call's would."""
        if self.base.stream is not None:
            self.base.stream.synchronize()
        pair = None
        if not self.failed:
            base, cand = self.base, self.cand
            pair = Pair(
                kind,
                rows,
                base.host_s * 1e6,
                base.calls_seconds() * 1e6,
                cand.host_s * 1e6,
                cand.calls_seconds() * 1e6,
                self.first,
            )
            self.shadow.record(pair, self.window)
        if timer is not None:
            timer.merge(self.base)
        return pair


class Forward:
    def __init__(
        self,
        model: Model,
        pool: torch.Tensor,
        trash_slot: int,
        max_rows: int,
        chunk: int,
        graphs: bool,
    ) -> None:
        cfg, dev = model.cfg, model.device
        self.model, self.pool, self.trash, self.chunk = model, pool, trash_slot, chunk
        self.max_rows = -(-max_rows // chunk) * chunk
        self.graphs = graphs and dev.type == "cuda"
        n = self.max_rows
        # token, position and KV slot of every row: one host-to-device copy per forward
        self.inputs = torch.zeros(3, n, dtype=torch.int64, device=dev)
        self.tok, self.pos, self.write = self.inputs.unbind(0)
        self.write.fill_(trash_slot)
        self.xs = torch.zeros(cfg.layers + 1, n, cfg.hidden, device=dev)
        self.q = torch.zeros(n, cfg.heads, cfg.kv_dim, device=dev)
        self.o = torch.zeros(n, cfg.heads, cfg.kv_lora_rank, device=dev)
        self.logits = torch.zeros(n, cfg.vocab_size, device=dev)
        self._captured: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.shadow: Shadow | None = None  # engine.shadow: set by the decoder

    def capture(self) -> None:
        """Capture every piece for every chunk count up front (at startup, as SGLang captures
        its decode graphs), so no capture happens while requests are being served. The
        buffers hold zeros and every KV write goes to the trash slot meanwhile."""
        if not self.graphs:
            return
        self.inputs.zero_()
        self.write.fill_(self.trash)
        with self.model.precision():
            for chunks in range(1, self.max_rows // self.chunk + 1):
                for piece in range(self.model.cfg.layers + 1):
                    self._piece(piece, chunks)
        torch.cuda.synchronize(self.inputs.device)

    @property
    def captured_graphs(self) -> int:
        return len(self._captured)

    # -- segments over chunk j of the static buffers ------------------------------------------
    def _pre(self, layer: int, j: int) -> None:
        s = slice(j * self.chunk, (j + 1) * self.chunk)
        if layer == 0:
            self.xs[0, s] = self.model.embed(self.tok[s])
        q = self.model.pre(layer, self.xs[layer, s], self.pos[s], self.write[s], self.pool[layer])
        self.q[s] = q

    def _post(self, layer: int, j: int) -> None:
        s = slice(j * self.chunk, (j + 1) * self.chunk)
        self.xs[layer + 1, s] = self.model.post(layer, self.xs[layer, s], self.o[s])

    def _head(self, j: int) -> None:
        s = slice(j * self.chunk, (j + 1) * self.chunk)
        self.logits[s] = self.model.head(self.xs[-1, s])

    def _piece(self, piece: int, chunks: int) -> None:
        """Everything between two attentions, for chunks 0 .. chunks - 1: piece 0 is layer 0's
        `pre`; piece l is layer l-1's `post` and layer l's `pre`; the last is the last layer's
        `post` and the head. One CUDA graph per (piece, chunks) (`capture`)."""
        last = self.model.cfg.layers

        def run() -> None:
            for j in range(chunks):
                if piece > 0:
                    self._post(piece - 1, j)
                if piece < last:
                    self._pre(piece, j)
                else:
                    self._head(j)

        if not self.graphs:
            run()
            return
        key = (piece, chunks)
        graph = self._captured.get(key)
        if graph is None:
            graph = self._capture(run)
            self._captured[key] = graph
        graph.replay()

    def _capture(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        # every segment is idempotent (it reads one buffer and writes another), so the warm-up
        # runs on the step's real data do no harm; the replay that follows computes it
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            fn()
        return graph

    # -- a forward -----------------------------------------------------------------------------
    def run(
        self,
        rows: Rows,
        attention: Attention,
        timer: AttentionTimer | None = None,
        kind: str = "step",
    ) -> torch.Tensor:
        """Logits [R, V] (a view of the static buffer: use before the next run); with a timer,
        the attention calls are timed into it. `kind` ("step" | "prefill") labels the forward
        for the shadow, when it samples this one."""
        cfg, n = self.model.cfg, len(rows)
        if n == 0:
            return self.logits[:0]
        if n > self.max_rows:
            raise ValueError(f"a forward of {n} rows exceeds the {self.max_rows} rows planned")
        chunks = -(-n // self.chunk)
        end = chunks * self.chunk
        host = np.zeros((3, end), dtype=np.int64)
        host[0, :n], host[1, :n], host[2, :n] = rows.tokens, rows.positions, rows.write_slots
        host[2, n:] = self.trash
        self.inputs[:, :end] = torch.from_numpy(host).to(self.inputs.device)

        def make_plan(backend: Attention = attention) -> Any:
            return backend.plan(rows.table, rows.lens, self.model.device)

        taken = self.shadow.take("attention", kind, n) if self.shadow is not None else None
        sampled = None
        if taken is not None:
            cand = taken.candidate
            sampled = ShadowedCalls(
                self.shadow, taken, self.model.device, timer.stream if timer else None
            )
            plan = sampled.plan(make_plan, lambda: make_plan(cand))
        else:
            plan = timer.host(make_plan) if timer else make_plan()
        with self.model.precision():  # eager pieces and the torch attention's bmm as captured
            for layer in range(cfg.layers):
                self._piece(layer, chunks)

                def call(layer: int = layer, backend: Attention = attention, p: Any = plan) -> Any:
                    return backend(
                        self.q[:n], self.pool[layer], p, cfg.softmax_scale, cfg.kv_lora_rank
                    )

                if sampled is not None:
                    self.o[:n] = sampled.call(call, lambda p, layer=layer: call(layer, cand, p))
                else:
                    self.o[:n] = timer.span(call) if timer else call()
            self._piece(cfg.layers, chunks)
        if sampled is not None:
            sampled.finish(kind, n, timer)
        return self.logits[:n]
