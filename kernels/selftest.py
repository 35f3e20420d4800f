"""Self-test of a kernel build on this host: every op against `kernels.reference`, ties included.

`python -m kernels.selftest --json [--lib PATH] [--shapes service|small] [--seed N] [--require-gpu]`

The CPU builds (the compiled C++ tree build and accept walk of `kernels.cpu`) are always
checked; the CUDA ops (top-k log-probs, tree build, greedy accept from ids and from logits,
tree-verify attention, KV compaction) when a GPU is visible and the guard passes: the GPU
exists and its free memory covers the shapes. No CUDA device (CPU torch, none visible) means
`"gpu": "skipped: <reason>"`, unless the caller asked for a GPU (`--require-gpu`, or a
non-empty `CUDA_VISIBLE_DEVICES`): then it is a failure. Inputs come from fixed seeds, with
quantised values so equal log-probs and equal logits occur. Prints one JSON document: `ok`,
`results` (one per op and backend: cases, mismatches, the first mismatch's evidence, seconds),
`gpu`, `gpu_name`, `arch`, `lib` (path, sha256, its build manifest), `torch`, `problems`.
Exit 0 every case passed, 1 a mismatch, an op error or a failed guard, 2 bad input (one line
on stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kernels import build as _build
from kernels import reference as ref

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
TREE_FIELDS = ("token_ids", "depths", "parents", "visibility", "first_child", "next_sibling")
TREE_FIELDS += ("num_nodes",)
ACCEPT_FIELDS = ("accepted", "accept_len", "bonus")
TREE_KINDS = ("ties_0.25", "ties_0.1", "tiny_ties", "drafter")
# service: H = block_size - 1 = 15, K 8 / 64, budgets 16 / 64 / 128, the production vocabulary
# for top-k, 8 heads a GPU (64 over TP 8), pages of 64. small: the same ops, seconds on a CPU.
SHAPES: dict[str, dict[str, Any]] = {
    "service": dict(
        batch=8,
        depth=15,
        ks=(8, 64),
        budgets=(16, 64, 128),
        vocab=163840,
        topk_rows=2,
        accept_vocab=32768,
        heads=8,
        prefixes=(0, 77, 1500),
        page_size=64,
    ),
    "small": dict(
        batch=3,
        depth=15,
        ks=(8,),
        budgets=(16, 64),
        vocab=4096,
        topk_rows=1,
        accept_vocab=1000,
        heads=2,
        prefixes=(0, 37),
        page_size=16,
    ),
}


class BadInput(ValueError):
    """The caller asked for something impossible (a library that does not exist)."""


# ----------------------------------------------------------------------------- inputs


def _rng(seed: int, *salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, *salt])


def tree_inputs(rng: np.random.Generator, b: int, h: int, k: int, kind: str, vocab: int):
    """Top-K [b, h, k] log-probs (float32, rows best first) and ids of one input kind."""
    if kind.startswith("ties_"):  # quantised: equal scores everywhere, the rank path decides
        lp = -rng.integers(0, 6, (b, h, k)).astype(np.float32) * np.float32(kind[5:])
    elif kind == "tiny_ties":  # ties far below the score's ulp (s - a + a need not be s)
        lp = np.full((b, h, k), -1e-9, dtype=np.float32)
        lp[:, 0, :] = -3.0 - np.arange(k) * 1e-9 - rng.random((b, 1)) * 4
        lp[:, :, ::3] -= 2e-9
    else:  # the top k of log_softmax over 4096 drafter logits
        x = rng.standard_normal((b, h, max(4096, k)), dtype=np.float32) * 2.5
        m = x.max(-1, keepdims=True)
        x = x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))
        lp = np.sort(x, axis=-1)[..., ::-1][..., :k]
    lp = np.ascontiguousarray(-np.sort(-lp, axis=-1), dtype=np.float32)
    return lp, rng.integers(0, vocab, (b, h, k), dtype=np.int64)


def tree_cases(shape: dict[str, Any], seed: int) -> Iterator[tuple[dict, np.ndarray, Any, int]]:
    b, h = shape["batch"], shape["depth"]
    for k in shape["ks"]:
        for budget in shape["budgets"]:
            for i, kind in enumerate(TREE_KINDS):
                lp, ids = tree_inputs(_rng(seed, k, budget, i), b, h, k, kind, shape["vocab"])
                case = {"B": b, "H": h, "K": k, "budget": budget, "inputs": kind, "seed": seed}
                yield case, lp, ids, budget


def follow_targets(rng: np.random.Generator, trees: ref.BatchedTrees, vocab: int) -> np.ndarray:
    """Target ids [B, budget+1] that follow a random child 85% of the time, else miss."""
    b, budget = trees.token_ids.shape
    tg = rng.integers(0, vocab, size=(b, budget + 1))
    for i in range(b):
        for node in range(int(trees.num_nodes[i]) + 1):
            kids, c = [], int(trees.first_child[i, node])
            while c >= 0:
                kids.append(c)
                c = int(trees.next_sibling[i, c])
            if kids and rng.random() < 0.85:
                tg[i, node] = trees.token_ids[i, rng.choice(kids) - 1]
    return tg


# ----------------------------------------------------------------------------- comparison


def first_difference(got: dict[str, Any], want: dict[str, Any]) -> dict[str, Any] | None:
    """Evidence of the first field / element where `got` differs from `want`, else None."""
    for name, w in want.items():
        w, g = np.asarray(w), np.asarray(got[name])
        if g.shape != w.shape:
            return {"field": name, "got_shape": list(g.shape), "want_shape": list(w.shape)}
        bad = np.argwhere(g != w)
        if bad.size:
            idx = tuple(int(i) for i in bad[0])
            return {
                "field": name,
                "index": list(idx),
                "got": g[idx].item(),
                "want": w[idx].item(),
                "elements_differing": int(len(bad)),
            }
    return None


class OpResult:
    """Cases run, cases that mismatched (or raised), the first one's evidence, seconds."""

    def __init__(self, op: str, backend: str) -> None:
        self.op, self.backend = op, backend
        self.cases = self.mismatches = 0
        self.first_mismatch: dict[str, Any] | None = None
        self.seconds = 0.0

    def check(self, case: dict[str, Any], fn: Callable[..., dict | None], *args: Any) -> None:
        """Run `fn(*args)` (evidence of a difference, or None) as one case."""
        t0 = time.perf_counter()
        try:
            evidence = fn(*args)
        except Exception as exc:  # a failing launch is evidence too, never a crash
            evidence = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        self.seconds += time.perf_counter() - t0
        self.cases += 1
        if evidence is not None:
            self.mismatches += 1
            if self.first_mismatch is None:
                self.first_mismatch = {"case": case, **evidence}

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "backend": self.backend,
            "cases": self.cases,
            "mismatches": self.mismatches,
            "first_mismatch": self.first_mismatch,
            "seconds": round(self.seconds, 3),
        }


def _fields(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return dict(zip(names, obj, strict=True))
    return {n: getattr(obj, n) for n in names}


# ----------------------------------------------------------------------------- CPU builds


def cpu_checks(shape: dict[str, Any], seed: int) -> list[OpResult]:
    """The compiled C++ tree build and accept walk against the references."""
    from kernels import cpu

    def run_build(lp: np.ndarray, ids: np.ndarray, budget: int, want: Any) -> dict | None:
        got = cpu.build_trees_cpp(lp, ids, budget)
        return first_difference(_fields(got, TREE_FIELDS), _fields(want, TREE_FIELDS))

    def run_accept(trees: Any, tg: np.ndarray, want: dict) -> dict | None:
        got = cpu.greedy_accept_cpp(trees, tg, shape["depth"])
        return first_difference(_fields(got, ACCEPT_FIELDS), want)

    build, accept = OpResult("build_trees", "cpp"), OpResult("greedy_accept", "cpp")
    for case, lp, ids, budget in tree_cases(shape, seed):
        want = ref.build_trees(lp, ids, budget)
        build.check(case, run_build, lp, ids, budget, want)
        tg = follow_targets(_rng(seed, budget, 7), want, shape["vocab"])
        want_acc = _fields(ref.greedy_accept_batch(want, tg, shape["depth"]), ACCEPT_FIELDS)
        accept.check(case, run_accept, want, tg, want_acc)
    return [build, accept]


# ----------------------------------------------------------------------------- GPU


def memory_needed(shape: dict[str, Any]) -> int:
    """Bytes of device memory the GPU checks use, with room for the context and workspaces."""
    topk = shape["topk_rows"] * shape["depth"] * shape["vocab"] * 6  # fp32 + bf16 logits
    n1 = max(shape["budgets"]) + 1
    accept = min(shape["batch"], 4) * n1 * shape["accept_vocab"] * 6
    pages = len(shape["prefixes"]) * (-(-(max(shape["prefixes"]) + n1) // shape["page_size"]) + 2)
    attn = (pages * shape["page_size"] + 2 * len(shape["prefixes"]) * n1) * 576 * 4 * 3
    return topk + accept + attn + (512 << 20)


def gpu_guard(shape: dict[str, Any], require: bool) -> tuple[str, dict[str, Any]]:
    """("ran" | "skipped: why" | "failed: why", facts about the visible GPU 0)."""
    import torch

    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    named = bool(cvd and cvd.strip() and not cvd.strip().startswith("-1"))
    if torch.version.cuda is None:
        reason = f"torch {torch.__version__} is a CPU build"
    elif not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        reason = f"no CUDA device visible (CUDA_VISIBLE_DEVICES={cvd!r})"
    else:
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        facts = {
            "gpu_name": props.name,
            "arch": f"sm_{props.major}{props.minor}",
            "compute_capability": f"{props.major}.{props.minor}",
            "gpu_uuid": str(getattr(props, "uuid", "")) or None,
            "cuda_visible_devices": cvd,
            "memory_free": free,
            "memory_total": total,
            "memory_needed": memory_needed(shape),
        }
        if free < facts["memory_needed"]:
            return f"failed: guard: {free} bytes free < {facts['memory_needed']} needed", facts
        return "ran", facts
    if require or named:
        why = "--require-gpu" if require else f"CUDA_VISIBLE_DEVICES={cvd}"
        return f"failed: guard: {reason}, but {why} asks for a GPU", {}
    return f"skipped: {reason}", {}


def _topk_check(shape: dict[str, Any], seed: int, dev: Any) -> OpResult:
    import torch

    from kernels import cuda as kc

    def run(xt: Any, x: np.ndarray, k: int, rlp: np.ndarray, rids: np.ndarray) -> dict | None:
        lp, ids = kc.topk_logprobs(xt.to(dev), k)
        diff = first_difference({"token_ids": ids.cpu().numpy()}, {"token_ids": rids})
        if diff:
            return diff
        # log-probs to float32 rounding: a few ulps of the row's log-sum-exp
        lse = (np.take_along_axis(x, rids, axis=-1) - rlp).astype(np.float64)
        tol = 4 * np.spacing(np.abs(lse).astype(np.float32)) + 2 * np.spacing(np.abs(rlp))
        got = lp.cpu().numpy()
        bad = np.argwhere(~(np.abs(got.astype(np.float64) - rlp) < tol + 1e-30))
        if not bad.size:
            return None
        i = tuple(int(j) for j in bad[0])
        return {
            "field": "log_probs",
            "index": list(i),
            "got": float(got[i]),
            "want": float(rlp[i]),
            "tol": float(tol[i]),
        }

    res = OpResult("topk_logprobs", "cuda")
    rows, v = shape["topk_rows"] * shape["depth"], shape["vocab"]
    for k in shape["ks"]:
        for ties in (True, False):
            rng = _rng(seed, k, int(ties), 11)
            if ties:  # few distinct logits: equal values at the top, broken by token id
                x = rng.integers(-8, 8, (rows, v), dtype=np.int8).astype(np.float32) * 0.5
            else:
                x = rng.standard_normal((rows, v), dtype=np.float32) * 3
            x[-1, rng.random(v) < 0.5] = -np.inf  # a masked vocabulary row
            want: dict[bytes, tuple] = {}
            for dtype in (torch.bfloat16, torch.float32):
                xt = torch.from_numpy(x).to(dtype)
                xf = xt.float().numpy()
                key = hashlib.sha256(xf.tobytes()).digest()  # tied logits are exact in bf16
                if key not in want:
                    want[key] = ref.topk_logprobs(xf, k)
                case = {"rows": rows, "V": v, "K": k, "ties": ties, "dtype": _name(dtype)}
                res.check({**case, "seed": seed}, run, xt, xf, k, *want[key])
    return res


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _tree_accept_checks(shape: dict[str, Any], seed: int, dev: Any) -> list[OpResult]:
    import torch

    from kernels import cuda as kc

    h = shape["depth"]

    def run_build(lp: np.ndarray, ids: np.ndarray, budget: int, want: Any) -> dict | None:
        out = kc.CudaTrees.empty(lp.shape[0], budget, dev)
        for t in out:  # poisoned: an element the kernel fails to write shows up
            t.fill_(True) if t.dtype == torch.bool else t.fill_(0x5A5A5A5A)
        lpt, idt = torch.from_numpy(lp).to(dev), torch.from_numpy(ids).to(dev)
        got = kc.build_trees(lpt, idt, budget, out=out)
        return first_difference(_host(got, TREE_FIELDS), _fields(want, TREE_FIELDS))

    def run_accept(trees: Any, tg: np.ndarray, want: dict) -> dict | None:
        got = kc.greedy_accept(trees, torch.from_numpy(tg).to(dev), h)
        return first_difference(_host(got, ACCEPT_FIELDS), want)

    build, accept = OpResult("build_trees", "cuda"), OpResult("greedy_accept", "cuda")
    fused = OpResult("greedy_accept_from_logits", "cuda")
    for case, lp, ids, budget in tree_cases(shape, seed):
        want = ref.build_trees(lp, ids, budget)
        build.check(case, run_build, lp, ids, budget, want)
        trees = kc.CudaTrees(*(torch.from_numpy(getattr(want, f)).to(dev) for f in TREE_FIELDS))
        tg = follow_targets(_rng(seed, budget, 7), want, shape["accept_vocab"])
        want_acc = _fields(ref.greedy_accept_batch(want, tg, h), ACCEPT_FIELDS)
        accept.check(case, run_accept, trees, tg, want_acc)
        if case["inputs"] == "ties_0.25" and case["K"] == shape["ks"][0]:
            _fused_check(fused, case, lp, ids, budget, shape, seed, dev)
    return [build, accept, fused]


def _fused_check(
    res: OpResult,
    case: dict,
    lp: np.ndarray,
    ids: np.ndarray,
    budget: int,
    shape: dict[str, Any],
    seed: int,
    dev: Any,
) -> None:
    """Accept fused with the argmax of [B, budget+1, V] logits: quantised, with planted ties."""
    import torch

    from kernels import cuda as kc

    b, v, h = min(lp.shape[0], 4), shape["accept_vocab"], shape["depth"]
    sub = ref.build_trees(lp[:b], ids[:b] % v, budget)  # token ids inside this vocabulary
    rng = _rng(seed, budget, 31)
    tg = follow_targets(rng, sub, v)
    x = rng.integers(-4, 4, (b, budget + 1, v), dtype=np.int8).astype(np.float32) * 0.5
    np.put_along_axis(x, tg[..., None], 100.0, axis=2)  # the argmax is the walk's target ...
    twin = np.where(rng.random(tg.shape) < 0.3, rng.integers(0, v, tg.shape), tg)
    np.put_along_axis(x, twin[..., None], 100.0, axis=2)  # ... or the smaller of two ties
    w = _fields(ref.greedy_accept_batch(sub, np.argmax(x, axis=-1), h), ACCEPT_FIELDS)
    trees = kc.CudaTrees(*(torch.from_numpy(getattr(sub, f)).to(dev) for f in TREE_FIELDS))

    def run(xt: Any) -> dict | None:
        return first_difference(_host(kc.greedy_accept_from_logits(trees, xt, h), ACCEPT_FIELDS), w)

    for dtype in (torch.bfloat16, torch.float32):
        xt = torch.from_numpy(x).to(dtype).to(dev)
        res.check({**case, "B": b, "V": v, "dtype": _name(dtype)}, run, xt)


def _attention_checks(shape: dict[str, Any], seed: int, dev: Any) -> list[OpResult]:
    import torch

    from kernels import cuda_attention as ka
    from kernels import reference_attention as ra

    heads, ps, h = shape["heads"], shape["page_size"], shape["depth"]
    pl = np.asarray(shape["prefixes"], dtype=np.int64)
    b, scale = len(pl), 576**-0.5

    def run_attn(q: Any, kv: Any, g: dict, want: np.ndarray, tol: float) -> dict | None:
        out = torch.full((q.shape[0], heads, 512), float("nan"), dtype=q.dtype, device=dev)
        ka.tree_verify_attention(q, kv, g["table"], g["pl"], g["tl"], g["vis"], scale, out=out)
        got = out.double().cpu().numpy()
        if not np.isfinite(got).all():
            i = [int(j) for j in np.argwhere(~np.isfinite(got))[0]]
            return {"field": "out", "index": i, "got": "non-finite (not written?)"}
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        return None if err < tol else {"field": "out", "rel_err": err, "tol": tol}

    def run_compact(kv: Any, g: dict, want: np.ndarray) -> dict | None:
        got = ka.compact_kv(kv.clone(), g["table"], g["pl"], g["acc"]).float().cpu().numpy()
        return first_difference({"kv_cache": got}, {"kv_cache": want})

    attn, comp = OpResult("tree_verify_attention", "cuda"), OpResult("compact_kv", "cuda")
    for budget in shape["budgets"]:
        rng = _rng(seed, budget, 23)
        lp, ids = tree_inputs(rng, b, h, shape["ks"][-1], "drafter", shape["vocab"])
        trees = ref.build_trees(lp, ids, budget)
        tl = trees.num_nodes + 1
        max_pages = int((-(-(pl + tl) // ps)).max()) + 1
        num_pages = b * max_pages + 3
        table = rng.permutation(num_pages)[: b * max_pages].reshape(b, max_pages)
        # values exact in bf16, so one float64 reference serves both dtypes
        kv = torch.from_numpy(rng.standard_normal((num_pages, ps, 576), dtype=np.float32))
        q = torch.from_numpy(rng.standard_normal((int(tl.sum()), heads, 576), dtype=np.float32))
        kv, q = kv.bfloat16().float(), q.bfloat16().float()
        want = ra.tree_verify_attention(q, kv, table, pl, tl, trees.visibility, scale)
        tg = follow_targets(_rng(seed, budget, 29), trees, shape["vocab"])
        accepted = ref.greedy_accept_batch(trees, tg, h)[0]
        want_kv = ra.compact_kv(kv, table, pl, accepted)
        host = {
            "table": table.astype(np.int32),
            "pl": pl.astype(np.int32),
            "tl": tl.astype(np.int32),
            "vis": trees.visibility,
            "acc": accepted,
        }
        g = {n: torch.from_numpy(np.ascontiguousarray(a)).to(dev) for n, a in host.items()}
        for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float32, 1e-5)):
            case = {
                "B": b,
                "heads": heads,
                "prefix_lens": pl.tolist(),
                "page_size": ps,
                "tree_lens": tl.tolist(),
                "dtype": _name(dtype),
                "seed": seed,
            }
            qd, kvd = q.to(dtype).to(dev), kv.to(dtype).to(dev)
            attn.check(case, run_attn, qd, kvd, g, want, tol)
            comp.check(case, run_compact, kvd, g, want_kv)
    return [attn, comp]


def _host(obj: Any, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {k: v.cpu().numpy() for k, v in _fields(obj, names).items()}


def gpu_checks(shape: dict[str, Any], seed: int) -> list[OpResult]:
    import torch

    dev = torch.device("cuda", 0)
    out = [_topk_check(shape, seed, dev), *_tree_accept_checks(shape, seed, dev)]
    return out + _attention_checks(shape, seed, dev)


# ----------------------------------------------------------------------------- main


def resolve_lib(arg: str | None) -> Path | None:
    """The library named by --lib (a file or a build directory) or $DDTREE_KERNELS_LIB."""
    raw = arg if arg is not None else os.environ.get("DDTREE_KERNELS_LIB")
    if not raw:
        return None
    path = Path(raw)
    if path.is_dir():
        path = path / _build.LIBRARY
    if not path.is_file():
        src = "--lib" if arg is not None else "DDTREE_KERNELS_LIB"
        raise BadInput(f"{src} {raw}: no such library file")
    return path.resolve()


def lib_facts(path: Path) -> tuple[dict[str, Any], list[str]]:
    """sha256 and the build manifest beside the library; problems if they disagree."""
    facts: dict[str, Any] = {"path": str(path), "sha256": _build.sha256_file(path)}
    problems = []
    manifest_file = path.parent / _build.MANIFEST
    if manifest_file.is_file():
        try:
            m = json.loads(manifest_file.read_text())
        except (OSError, ValueError) as exc:
            return facts, [f"{manifest_file}: unreadable manifest ({exc})"]
        keys = ("arch", "sass", "ptx", "source_digest", "library_sha256", "nvcc_version")
        facts["manifest"] = {k: m.get(k) for k in (*keys, "built_at")}
        if m.get("library_sha256") != facts["sha256"]:
            problems.append(
                f"library sha256 {facts['sha256']} != manifest's {m.get('library_sha256')}"
            )
        if m.get("source_digest") != _build.source_digest():
            problems.append(
                "the library was built from other sources than these kernels "
                "(manifest source_digest differs)"
            )
    return facts, problems


# the device nodes of an NVIDIA driver (Linux; /dev/dxg under WSL): without any of them no CUDA
# device can be visible, and the self-test need not import torch (seconds) to find that out
NVIDIA_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


def _no_gpu_possible(require: bool) -> str | None:
    """Why no GPU check can run here, found without importing torch (None: ask torch). Only
    when nothing asks for a GPU: --require-gpu or a named CUDA_VISIBLE_DEVICES go to the guard,
    which fails if there is none."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    named = bool(cvd and cvd.strip() and not cvd.strip().startswith("-1"))
    if require or named or any(os.path.exists(p) for p in NVIDIA_NODES):
        return None
    return f"no NVIDIA device on this host (none of {', '.join(NVIDIA_NODES)})"


def _torch_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def run(lib: Path | None, shapes: str, seed: int, require_gpu: bool) -> tuple[dict, int]:
    t0 = time.perf_counter()
    shape = SHAPES[shapes]
    no_gpu = _no_gpu_possible(require_gpu)
    if no_gpu is None:
        import torch

        version, cuda = torch.__version__, torch.version.cuda
    else:  # the installed torch's version, without importing it
        version, cuda = _torch_version(), "not imported: " + no_gpu
    doc: dict[str, Any] = {
        "ok": False,
        "module": "kernels.selftest",
        "shapes": shapes,
        "shape": shape,
        "seed": seed,
        "torch": version,
        "lib": None,
        "torch_cuda": cuda,
        "problems": [],
    }
    if lib is not None:
        doc["lib"], doc["problems"] = lib_facts(lib)
        os.environ["DDTREE_KERNELS_LIB"] = str(lib)  # what kernels.cuda_core loads
    ops = cpu_checks(shape, seed)
    status, facts = gpu_guard(shape, require_gpu) if no_gpu is None else (f"skipped: {no_gpu}", {})
    doc.update({"gpu": status, "gpu_name": None, "arch": None, **facts})
    doc["switches"] = {k: v for k, v in os.environ.items() if k.startswith("DDTREE_")}
    if status == "ran" and not doc["problems"]:
        ops += gpu_checks(shape, seed)
        if doc["lib"] is None:
            from kernels import cuda_core

            doc["lib"] = lib_facts(cuda_core.library_path())[0]
    elif status.startswith("failed"):
        doc["problems"].append(status)
    doc["results"] = [o.to_dict() for o in ops]  # one per (op, backend)
    doc["ok"] = not doc["problems"] and all(o.mismatches == 0 and o.cases > 0 for o in ops)
    doc["seconds"] = round(time.perf_counter() - t0, 2)
    return doc, EXIT_PASS if doc["ok"] else EXIT_FAIL


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadInput(message)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m kernels.selftest", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document (always on)")
    ap.add_argument("--lib", help="libddtree_kernels.so, or the directory of a kernels.build")
    ap.add_argument("--shapes", default="service", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--require-gpu", action="store_true", help="no usable GPU is a failure")
    try:
        args = ap.parse_args(argv)
        lib = resolve_lib(args.lib)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(
            json.dumps(
                {
                    "ok": False,
                    "module": "kernels.selftest",
                    "error": "bad_input",
                    "message": str(exc),
                }
            )
        )
        return EXIT_BAD_INPUT
    try:
        doc, rc = run(lib, args.shapes, args.seed, args.require_gpu)
    except Exception as exc:  # a bug of ours is a failed self-test with its evidence, not a crash
        doc = {
            "ok": False,
            "module": "kernels.selftest",
            "error": "internal",
            "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-4000:],
        }
        rc = EXIT_FAIL
    print(json.dumps(doc, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
