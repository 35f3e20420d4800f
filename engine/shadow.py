"""Shadow timing: a candidate backend (attention, or the tree build) run beside the serving one
on the service's own forwards, its output thrown away, so its speed-up is measured inside the
serving process.

Why: the torch baseline's cost is its GPU work plus a host part (plans, launch gaps) of 10-45%
of its stage, and that host part differs from process to process (docs/performance.md, "Why s
is timed inside the service": the same kernels' GPU time agreed to 0.3% between the service and a
bench, the launch gaps differed by up to 2.3x in either direction). A bench in another process
samples another host speed. The shadow times both backends on the same forwards, in the
serving process, under the load the profile drives, so s is a paired ratio.

How a sampled forward runs (engine.forward.Forward.run): both plans are built before the first
piece, then in every layer both calls run between the same two graph pieces; which backend goes
first alternates from one sampled forward of the same kind and size to the next, so each has
half its samples in either place (`ops.measure.shadow` reports s over each half apart: the order's
effect). The serving backend's output is the one the forward uses; the candidate's is discarded.
Each backend has its own timer (its plan on the host clock, its calls with CUDA events, as the
engine's stage timing), read after one sync at the end of the sampled forward.

The tree build (engine.decode.Decoder.step, through the same engine.forward.ShadowedCalls): on
a sampled step both tree-build stages run on the same log-probs, in the order given, each
between CUDA events on the step's stream as the stage clock times a stage, then one sync; the
serving stage's trees go on, and the candidate's time is taken out of the step's tree_build
stage (StageClock.exclude).

Armed for a bounded number of forwards (`POST /shadow`), after which it is off by itself. Every
sampled forward costs the service the candidate's time as well (and the sync), which is why
`ops profile` arms it in a window of its own, after it has measured f. The candidate is a new
instance of the named backend (engine.backends.attention_backend): the same kind as the
serving one is an A/A shadow, which measures the method's own bias (order, position). A
candidate that raises is disarmed with its error kept; the forward goes on with the serving
backend's output (an error the GPU's context cannot survive, as an illegal address, ends the
process like any other kernel fault: the profile arms a candidate only after the bench checked
it against the references).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from checks.vocabulary import SHADOWED  # the components the engine can shadow
from engine.protocol import _short  # a refused value, cut for the message (bodies may be MBs)

MAX_FORWARDS = 20_000  # the most a window may sample (and the pairs it keeps)


@dataclass
class Pair:
    """One sampled forward: its kind ("step" | "prefill"), rows, and each backend's plan on the
    host clock and calls on the GPU (microseconds); `first`: which ran first ("base" | "cand")."""

    kind: str
    rows: int
    base_plan_us: float
    base_calls_us: float
    cand_plan_us: float
    cand_calls_us: float
    first: str

    def row(self) -> list:
        return [
            self.kind,
            self.rows,
            round(self.base_plan_us, 1),
            round(self.base_calls_us, 1),
            round(self.cand_plan_us, 1),
            round(self.cand_calls_us, 1),
            self.first,
        ]


class Taken(NamedTuple):
    """A sampled call: the candidate, which goes first ("base" | "cand"), and the window it was
    taken in (a pair or an error from an earlier window, finishing after a re-arm, is dropped)."""

    candidate: Any
    first: str
    window: int


PAIR_FIELDS = [
    "kind",
    "rows",
    "base_plan_us",
    "base_calls_us",
    "cand_plan_us",
    "cand_calls_us",
    "first",
]


class Shadow:
    """The engine's shadow: armed from the front end's thread, taken on the scheduler's."""

    def __init__(self, serving: dict[str, str], make_backend: Any, device_type: str) -> None:
        self.serving = dict(serving)  # component -> the serving backend's name
        self._make = make_backend  # (component, kind) -> a backend (engine.backends)
        self._device_type = device_type
        self._lock = threading.Lock()
        self.component: str | None = None
        self.candidate: Any = None
        self.kind: str | None = None
        self.armed = 0  # forwards asked for in this window
        self.left = 0
        self.sampled = 0
        self.pairs: list[Pair] = []
        self.error: str | None = None
        self._seen: dict[tuple[str, int], int] = {}  # sampled forwards per (kind, rows)
        self.window = 0  # arms so far: each arm starts a window of its own

    # -- the front end's side ------------------------------------------------------------------
    def arm(self, body: Any) -> dict[str, Any]:
        """`{"attention": KIND, "forwards": N}` (or `"tree_build": KIND`): sample the next N
        forwards (attention) or steps (tree_build) against a fresh KIND backend (a new window:
        earlier pairs are dropped); `{"forwards": 0}` disarms and keeps the pairs. ValueError
        (the caller's 400) on anything else."""
        from engine.components import COMPONENTS

        if not isinstance(body, dict):
            raise ValueError(
                'the body must be a JSON object, e.g. {"attention": "cuda", "forwards": 400}'
            )
        unknown = sorted(set(body) - {*SHADOWED, "forwards"})
        if unknown:
            comps = " or ".join(SHADOWED)
            field = _short(unknown[0])
            raise ValueError(
                f"unknown field {field}: the engine shadows {comps} (fields: one of them, forwards)"
            )
        n = body.get("forwards")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_FORWARDS:
            raise ValueError(f"'forwards' must be an integer 0..{MAX_FORWARDS}, got {_short(n)}")
        if n == 0:
            with self._lock:
                self.left = 0
            return self.doc()
        named = [c for c in SHADOWED if c in body]
        if len(named) != 1:
            raise ValueError(
                f"name one component to shadow ({' or '.join(SHADOWED)}), got {len(named)}"
            )
        comp = named[0]
        kind = body[comp]
        kinds = COMPONENTS[comp]
        if kind not in kinds:
            raise ValueError(f"'{comp}' must be one of {', '.join(kinds)}, got {_short(kind)}")
        if kind == "cuda" and self._device_type != "cuda":
            raise ValueError(f"a cuda {comp} shadow needs the engine on a GPU (--device cuda)")
        try:
            candidate = self._make(comp, kind)
        except Exception as e:  # e.g. the kernels' library missing from this release
            raise ValueError(f"the {kind} {comp} backend cannot start here: {e}") from e
        with self._lock:
            self.window += 1
            self.component, self.candidate, self.kind = comp, candidate, kind
            self.armed, self.left, self.sampled = n, n, 0
            self.pairs, self.error, self._seen = [], None, {}
        return self.doc()

    def doc(self) -> dict[str, Any]:
        """`/get_server_info`'s `shadow`: the window's settings and every pair so far."""
        with self._lock:
            return {
                "component": self.component,
                "baseline": self.serving.get(self.component) if self.component else None,
                "candidate": self.kind,
                "armed_forwards": self.armed,
                "left": self.left,
                "sampled": self.sampled,
                "error": self.error,
                "pair_fields": PAIR_FIELDS,
                "pairs": [p.row() for p in self.pairs],
            }

    # -- the scheduler's side ------------------------------------------------------------------
    def take(self, component: str, kind: str, rows: int) -> Taken | None:
        """For the `component` call about to run (a forward's attention, a step's tree build):
        (candidate, which goes first) if it is sampled. The order alternates per (kind, rows),
        not over all calls: a prompt's prefill blocks come in a fixed sequence (576 rows, then
        447), which a global alternation would pin each to one order."""
        if self.left <= 0:  # the common case, without the lock
            return None
        with self._lock:
            if self.left <= 0 or self.candidate is None or component != self.component:
                return None
            self.left -= 1
            n = self._seen.get((kind, rows), 0)
            self._seen[(kind, rows)] = n + 1
            self.sampled += 1
            return Taken(self.candidate, "base" if n % 2 == 0 else "cand", self.window)

    def record(self, pair: Pair, window: int) -> None:
        with self._lock:
            if window == self.window:
                self.pairs.append(pair)

    def fail(self, error: BaseException, window: int) -> None:
        """The candidate raised: off, with the error kept for the doc."""
        with self._lock:
            if window != self.window:
                return
            self.left = 0
            self.error = f"{type(error).__name__}: {error}"[:500]
