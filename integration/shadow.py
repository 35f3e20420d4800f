"""The hook's shadow: the stock function serves, a candidate runs beside it on the same inputs.

`DDTREE_OPS_SGLANG=shadow:tree_build=cpp` (or `.../8` for one call in 8; `integration.hook`
parses it) wraps the fork's function in `shadowed`: every call runs the stock function and
returns its answer, the very object, unchanged; on a sampled call the candidate also runs, on
copies of the inputs (the tensors cloned, the child maps' dicts copied: whatever the candidate
does to them, the service's own inputs and answers are not touched; a workspace argument is
never passed on), and its answer is compared with the stock's, every output element and
structure (types, dtypes, shapes, values, list lengths, each dict's items in order). The two
run in turn, the stock first on even-numbered pairs and the candidate first on odd ones, so
the cache either one leaves warm favours neither; the candidate's first call in a process (a
cold start: its first allocations, a lazily loaded library; on a loaded two-core machine 10 ms
against 40 us) is compared but not timed. Both times go into the process's counters
(`integration.counters`, layout `checks.hook_counters`): calls compared, mismatched, the two
sums (s = stock seconds / candidate seconds), a ring of the last pairs (its spread), and the
shadow's own time (the candidate, the copies, the comparison: what the service pays for it).

A function that writes its answer into output arguments (the GPU accept walk:
`integration.hook.COMPONENTS`' `outputs`) is compared on those: the stock writes the service's
own outputs, the candidate copies of them (taken before either ran), and the answer compared
is (what it returned, *its outputs). On a sampled call whose tensors are on a GPU, the device
is synchronised before and after each of the two calls, so each time is the work's, not its
launch's (a cost the service pays on sampled calls only, counted in the shadow's own time).

A candidate that raises where the stock answered is a mismatch (counted in cand_errors too); a
stock call that raises is the service's own error, raised as it came, with nothing compared.
The first mismatching cases of each process (MAX_SAVED per function) are written for replay
as `<run>/hook-mismatch-<pid>-<component>-<n>.json` (inputs, both answers, the first
difference), the only I/O on the call path, and only after a mismatch;
`python -m integration.shadow --replay FILE` runs the stock and the candidate on them again.
A candidate is one of the drop-ins' backends (`cpp`, `cuda`, with the stock as their
fallback, as they would serve) or a function named by its import path,
`module.path:function`, for trying a builder that must never serve.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from checks.atomic import write_atomic
from checks.hook_counters import FUNCTIONS, field, ring_index
from integration.counters import Counters
from integration.hook import COMPONENTS, CONTRACTS, load_factory

MAX_SAVED = 3  # mismatching cases written per function and process
SCHEMA = "ddtree-ops/hook-mismatch/v1"
# the parameters that make each component's answer (its first contract's; a later version
# adds only passive ones)
CORE = {c.component: c.core for c in reversed(CONTRACTS)}


# ----------------------------------------------------------------------------- candidates


def is_import_path(kind: str) -> bool:
    mod, sep, fn = kind.partition(":")
    return bool(sep) and all(p.isidentifier() for p in mod.split(".")) and fn.isidentifier()


def make_candidate(component: str, kind: str, stock: Callable, passive: tuple = ()) -> Callable:
    """The candidate for `component`: a drop-in backend (its fallback the stock function, as it
    would serve) or the function at `module:function`. Raises when it cannot run here."""
    if is_import_path(kind):
        mod, _, name = kind.partition(":")
        fn = getattr(importlib.import_module(mod), name, None)
        if not callable(fn):
            raise ValueError(f"{kind}: no function {name} in {mod}")
        return fn
    return load_factory(component)(component, kind, stock, passive)


# ----------------------------------------------------------------------------- the wrapper


def _copy(x: Any) -> Any:
    """An input the candidate may do anything to: tensors cloned, lists of dicts copied."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, list):
        return [dict(m) if type(m) is dict else _copy(m) for m in x]
    return x


def core_args(component: str, stock: Callable, copy: bool = True) -> Callable[[tuple, dict], tuple]:
    """(args, kwargs) of a call of `stock` -> copies of the contract's core arguments, in order
    (the fork's worker passes them positionally; anything else is bound by the signature);
    with copy=False, the arguments themselves."""
    names = CORE[component]
    sig = inspect.signature(stock)
    n = len(names)

    def core(args: tuple, kwargs: dict) -> tuple:
        if len(args) >= n and not any(k in names for k in kwargs):
            got = args[:n]
        else:
            bound = sig.bind(*args, **kwargs)
            got = tuple(bound.arguments[k] for k in names)
        return tuple(_copy(x) for x in got) if copy else got

    return core


def output_positions(component: str) -> tuple[int, ...]:
    """Where the parameters the function writes in place sit among its core arguments."""
    return tuple(CORE[component].index(o) for o in COMPONENTS[component].outputs)


def answer(ret: Any, args: tuple, outs: tuple[int, ...]) -> Any:
    """What a call answered: its return value, and with outputs written in place (the GPU
    accept walk), the tuple (return value, *those outputs)."""
    return (ret, *(args[i] for i in outs)) if outs else ret


def _sync_for(args: tuple) -> Callable[[], None] | None:
    """torch.cuda.synchronize for a call whose tensors are on a GPU (the shadow then times the
    work, not its launch), else None."""
    for x in args:
        if isinstance(x, torch.Tensor) and x.is_cuda:
            dev = x.device
            return lambda: torch.cuda.synchronize(dev)
    return None


def shadowed(
    stock: Callable,
    candidate: Callable,
    counters: Counters,
    component: str,
    every: int,
    save: Callable[[int, tuple, Any, Any, str], None],
) -> Callable:
    """`stock`, counted as `integration.counters.timed` counts it, with `candidate` run beside
    it on one call in `every` (see the module's doc). `save(n, inputs, stock_out, cand_out,
    difference)` writes a mismatching case."""
    names = (
        "calls",
        "ns",
        "errors",
        "compared",
        "mismatched",
        "stock_ns",
        "cand_ns",
        "cand_errors",
        "overhead_ns",
        "saved",
        "pairs",
    )
    f = {name: field(component, name) for name in names}
    calls, total, errors, pairs = f["calls"], f["ns"], f["errors"], f["pairs"]
    counters.set(component, "shadow_every", every)
    clock = time.perf_counter_ns
    core = core_args(component, stock)
    real = core_args(component, stock, copy=False)
    outs = output_positions(component)
    mv = counters.mv
    seen = 0
    cold = True

    def plain(args: tuple, kwargs: dict) -> Any:
        t0 = clock()
        try:
            out = stock(*args, **kwargs)
        except BaseException:
            mv[total] += clock() - t0
            mv[calls] += 1
            mv[errors] += 1
            raise
        mv[total] += clock() - t0
        mv[calls] += 1
        return out

    def run_candidate(cargs: tuple, sync: Callable | None) -> tuple[Any, str | None, int]:
        if sync:
            sync()
        c0 = clock()
        try:
            got = answer(candidate(*cargs), cargs, outs)
            if sync:
                sync()
        except Exception as exc:  # the candidate's failure is a finding, never the service's
            return None, f"{type(exc).__name__}: {exc}", clock() - c0
        return got, None, clock() - c0

    @functools.wraps(stock)
    def shadow(*args: Any, **kwargs: Any) -> Any:
        nonlocal seen, cold
        seen += 1
        if seen % every:
            return plain(args, kwargs)
        t_in = clock()
        try:
            cargs = core(args, kwargs)
        except Exception:  # a call the stock will refuse (its TypeError): nothing to compare
            return plain(args, kwargs)
        before = tuple(_copy(cargs[i]) for i in outs)  # outputs as they came, for a saved case
        sync = _sync_for(cargs)
        k = mv[pairs]
        cand = (None, None, 0)
        if k & 1:
            cand = run_candidate(cargs, sync)
        if sync:
            sync()
        t0 = clock()
        try:
            out = stock(*args, **kwargs)
            if sync:
                sync()
        except BaseException:
            s_ns = clock() - t0
            mv[total] += s_ns
            mv[calls] += 1
            mv[errors] += 1
            mv[f["overhead_ns"]] += clock() - t_in - s_ns
            raise
        s_ns = clock() - t0
        mv[total] += s_ns
        mv[calls] += 1
        if not k & 1:
            cand = run_candidate(cargs, sync)
        got, exc, c_ns = cand
        served = answer(out, real(args, kwargs), outs) if outs else out
        diff = f"the candidate raised {exc}" if exc else difference(served, got)
        mv[f["compared"]] += 1
        if exc:
            mv[f["cand_errors"]] += 1
        elif cold:  # the candidate's first call in this process: compared, not timed
            cold = False
        else:
            at = ring_index(component, k)
            mv[at], mv[at + 1] = s_ns, c_ns
            mv[pairs] = k + 1
            mv[f["stock_ns"]] += s_ns
            mv[f["cand_ns"]] += c_ns
        if diff is not None:
            mv[f["mismatched"]] += 1
            n = mv[f["saved"]]
            if n < MAX_SAVED:
                mv[f["saved"]] = n + 1
                try:
                    inputs = list(core(args, kwargs))
                    for i, x in zip(outs, before, strict=True):
                        inputs[i] = x
                    save(n + 1, tuple(inputs), served, got if exc is None else exc, diff)
                except Exception:  # noqa: BLE001 - a case not written is never the service's
                    pass
        mv[f["overhead_ns"]] += clock() - t_in - s_ns
        return out

    def rebind(new: memoryview) -> None:
        nonlocal mv, seen, cold
        mv, seen, cold = new, 0, True
        new[field(component, "shadow_every")] = every

    counters.on_rebind(rebind)
    shadow.ddtree_ops_counted = component  # type: ignore[attr-defined]
    shadow.ddtree_ops_shadow = candidate  # type: ignore[attr-defined]
    return shadow


# ----------------------------------------------------------------------------- comparison


_Tensor = torch.Tensor


def same(want: Any, got: Any) -> bool:
    """`got` is `want` element for element and structure for structure (the fast check; see
    `difference`): tensors of one dtype, shape and device with equal values, lists and tuples
    of one type and length, dicts with the same items in the same order, scalars of one type."""
    tw = type(want)
    if tw is not type(got):
        return False
    if tw is _Tensor:
        return (
            want.dtype == got.dtype
            and want.shape == got.shape
            and want.device == got.device
            and torch.equal(want, got)
        )
    if tw is list or tw is tuple:
        if len(want) != len(got):
            return False
        if want and type(want[0]) is int:  # parents, paths: one comparison, then the types
            return want == got and all(type(x) is int for x in got)
        if want and type(want[0]) is dict:  # child maps: the same items in order, same types
            if any(type(d) is not dict for d in got):
                return False
            a, b = [list(d.items()) for d in want], [list(d.items()) for d in got]
            if a != b:
                return False
            flat_a = [x for items in a for kv in items for x in kv]
            flat_b = [x for items in b for kv in items for x in kv]
            return list(map(type, flat_a)) == list(map(type, flat_b))
        return all(map(same, want, got))
    if tw is dict:
        return (
            list(want.items()) == list(got.items())
            and all(map(same, want, got))
            and all(map(same, want.values(), got.values()))
        )
    return want == got or (tw is float and want != want and got != got)


def difference(want: Any, got: Any, where: str = "answer") -> str | None:
    """None when `got` is `want` element for element and structure for structure, else the
    first difference in words ("answer[2][5]: stock 3 (int), candidate 4 (int)")."""
    if where == "answer" and same(want, got):
        return None
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where}: stock a tensor, candidate {type(got).__name__}"
        for what in ("dtype", "shape", "device"):
            if getattr(want, what) != getattr(got, what):
                a, b = getattr(want, what), getattr(got, what)
                return f"{where}: {what} stock {a}, candidate {b}"
        if torch.equal(want, got):
            return None
        both = want.detach().cpu().reshape(-1), got.detach().cpu().reshape(-1)
        eq = both[0] == both[1]
        if both[0].is_floating_point():
            eq |= both[0].isnan() & both[1].isnan()
        i = int((~eq).nonzero()[0]) if (~eq).any() else 0
        idx = list(torch.unravel_index(torch.tensor(i), tuple(want.shape))) if want.dim() else []
        at = "".join(f"[{int(j)}]" for j in idx)
        return f"{where}{at}: stock {both[0][i].item()!r}, candidate {both[1][i].item()!r}"
    if isinstance(want, list | tuple):
        if type(got) is not type(want):
            return f"{where}: stock a {type(want).__name__}, candidate {type(got).__name__}"
        if len(got) != len(want):
            return f"{where}: stock {len(want)} items, candidate {len(got)}"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            d = difference(a, b, f"{where}[{i}]")
            if d is not None:
                return d
        return None
    if isinstance(want, dict):
        if type(got) is not type(want):
            return f"{where}: stock a {type(want).__name__}, candidate {type(got).__name__}"
        a, b = list(want.items()), list(got.items())
        if a == b and all(
            type(x[1]) is type(y[1]) and type(x[0]) is type(y[0]) for x, y in zip(a, b, strict=True)
        ):
            return None
        return f"{where}: stock {_short(a)}, candidate {_short(b)} (items in order)"
    if type(got) is not type(want) or got != want:
        if isinstance(want, float) and isinstance(got, float) and math.isnan(want) and got != got:
            return None
        return (
            f"{where}: stock {want!r} ({type(want).__name__}), candidate {got!r} "
            f"({type(got).__name__})"
        )
    return None


def _short(items: list) -> str:
    """A dict's items for a message: the first differing one in view, at most ~240 chars."""
    text = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in items) + "}"
    return text if len(text) <= 240 else text[:236] + "...}"


# ----------------------------------------------------------------------------- saved cases


def encode(x: Any) -> Any:
    """JSON for an input or an answer: tensors with dtype, shape and values; dicts as [k, v]."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        return {
            "tensor": {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "device": str(x.device),
                "data": t.reshape(-1).tolist(),
            }
        }
    if isinstance(x, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"tuple": [encode(v) for v in x]}
    if isinstance(x, list):
        return [encode(v) for v in x]
    if isinstance(x, BaseException):
        return {"error": f"{type(x).__name__}: {x}"}
    if x is None or isinstance(x, bool | int | float | str):
        return x
    return {"repr": repr(x)[:2000]}


def decode(x: Any) -> Any:
    if isinstance(x, list):
        return [decode(v) for v in x]
    if isinstance(x, dict):
        if "tensor" in x:
            t = x["tensor"]
            dtype = getattr(torch, t["dtype"])
            return torch.tensor(t["data"], dtype=dtype).reshape(t["shape"])
        if "dict" in x:
            return {decode(k): decode(v) for k, v in x["dict"]}
        if "tuple" in x:
            return tuple(decode(v) for v in x["tuple"])
        raise ValueError(f"cannot decode {sorted(x)}")
    return x


def saver(run_dir: Path, component: str, kind: str, release: str) -> Callable:
    """save(n, inputs, stock_out, cand_out, difference) writes the process's n-th mismatching
    case of `component` to <run>/hook-mismatch-<pid>-<component>-<n>.json."""

    def save(n: int, inputs: tuple, stock_out: Any, cand_out: Any, diff: str) -> None:
        pid = os.getpid()
        path = run_dir / f"hook-mismatch-{pid}-{component}-{n}.json"
        doc = {
            "schema": SCHEMA,
            "component": component,
            "function": FUNCTIONS[component],
            "candidate": kind,
            "release_id": release,
            "pid": pid,
            "case": n,
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "difference": diff,
            "inputs": dict(zip(CORE[component], (encode(a) for a in inputs), strict=True)),
            "stock": encode(stock_out),
            "candidate_answer": encode(cand_out),
            "replay": f"python -m integration.shadow --replay {path}",
        }
        write_atomic(path, (json.dumps(doc) + "\n").encode())

    return save


def replay(path: Path, candidate: str | None = None) -> dict[str, Any]:
    """The saved case's inputs through the fork's function (this interpreter's; the stock one
    under any hook) and the candidate again: {"same", "difference", ...}."""
    case = json.loads(path.read_text())
    if case.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a saved case ({SCHEMA})")
    comp = case["component"]
    mod = importlib.import_module(COMPONENTS[comp].module)
    stock = inspect.unwrap(getattr(mod, FUNCTIONS[comp]))
    stock = getattr(stock, "ddtree_ops_stock", stock)
    kind = candidate or case["candidate"]
    cand = make_candidate(comp, kind, stock)
    args = tuple(decode(case["inputs"][k]) for k in CORE[comp])
    outs = output_positions(comp)
    mine = tuple(_copy(a) for a in args)
    want = answer(stock(*mine), mine, outs)
    try:
        theirs = tuple(_copy(a) for a in args)
        got = answer(cand(*theirs), theirs, outs)
        diff = difference(want, got)
    except Exception as exc:  # noqa: BLE001 - the candidate's failure is the finding
        diff = f"the candidate raised {type(exc).__name__}: {exc}"
    saved_stock_same = difference(decode(case["stock"]), want) is None
    return {
        "ok": diff is None,
        "case": str(path),
        "component": comp,
        "candidate": kind,
        "same": diff is None,
        "difference": diff,
        "stock_as_saved": saved_stock_same,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m integration.shadow", description="Replay a shadow's saved mismatching case."
    )
    ap.add_argument("--replay", type=Path, required=True, help="a hook-mismatch-*.json file")
    ap.add_argument("--candidate", default=None, help="another candidate (default: the case's)")
    ap.add_argument("--json", action="store_true", help="one JSON document (always)")
    args = ap.parse_args(argv)
    try:
        doc = replay(args.replay, args.candidate)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 2
    print(json.dumps(doc))
    return 0 if doc["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
