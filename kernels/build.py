"""Build the DDTree CUDA kernels with nvcc into `DIR/libddtree_kernels.so` plus `DIR/manifest.json`.

`python -m kernels.build --arch sm_90,sm_120 --out DIR [--json]`: real SASS for every arch and
PTX of the highest, from the explicit source list `SOURCES` (append yours there). The build is
atomic: it happens in a temporary directory beside DIR, which then replaces DIR by rename, so
DIR is never half-written. Exit codes: 0 built, 1 the compiler failed, 2 bad input (unknown
arch, no nvcc).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CSRC = Path(__file__).resolve().parent / "csrc"
LIBRARY = "libddtree_kernels.so"
MANIFEST = "manifest.json"
# Compiled sources (order matters only for reading); headers are hashed, not compiled.
SOURCES: list[str] = [
    "ddtree_abi.cu",
    "topk_logprobs.cu",
    "tree_build.cu",
    "greedy_accept.cu",
    "tree_verify_attention.cu",
    "kv_compact.cu",
    "retrieve_accept.cu",
]
HEADERS: list[str] = [
    "ddtree_kernels.h",
    "ddtree_common.cuh",
    "ddtree_attention.h",
    "tree_verify_attention_mma.cuh",
    "tree_verify_attention_wgmma.cuh",
    "tree_build_heap.cuh",
    "tree_build_levels.cuh",
    "ddtree_retrieve_accept.h",
]
FLAGS: list[str] = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--threads", "0"]
_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


def cache_dir() -> Path:
    """`$DDTREE_CACHE`, default `~/.cache/ddtree-ops`: the compiled libraries, by source digest."""
    env = os.environ.get("DDTREE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ddtree-ops"


def cached(path: Path, make: Callable[[], None]) -> Path:
    """`path`, made first by `make()` (which must create it atomically) when missing, under a
    file lock beside it so that concurrent processes build it once. The one cache-and-build
    helper of the CUDA library (`kernels.cuda_core`) and the C++ baseline (`kernels.cpu`)."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():  # another process may have built it while we waited
            make()
    return path


class BuildError(RuntimeError):
    """nvcc ran and failed; `tail` holds the end of its output."""

    def __init__(self, message: str, *, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


class BadInput(ValueError):
    """The build was asked for something impossible (unknown arch, no nvcc)."""


def find_nvcc() -> str:
    """Path of nvcc: $NVCC if set (and only it), else PATH, else /usr/local/cuda/bin."""
    env = os.environ.get("NVCC")
    for cand in [env] if env else [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise BadInput("nvcc not found (set NVCC or put the CUDA toolkit's bin on PATH)")


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release [^\n]*", out)
    return m.group(0) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def parse_archs(spec: str | list[str], nvcc: str) -> list[str]:
    """'sm_90,sm_120' -> ['sm_90', 'sm_120'], each checked against what nvcc can target."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    archs = [a.strip() for a in items if a.strip()]
    if not archs:
        raise BadInput("no arch given (expected e.g. --arch sm_90,sm_120)")
    proc = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=False)
    known = set(proc.stdout.split()) if proc.returncode == 0 else set()
    for a in archs:
        if not _ARCH_RE.match(a) or (known and a not in known):
            hint = f" (nvcc knows: {', '.join(sorted(known))})" if known else ""
            raise BadInput(f"unknown arch {a!r}{hint}")
    return sorted(set(archs), key=_arch_number)


def _arch_number(arch: str) -> tuple[int, str]:
    m = _ARCH_RE.match(arch)
    assert m is not None
    return int(m.group(1)), m.group(2)


def sass_targets(archs: list[str]) -> list[str]:
    """Real SASS built for `archs`: sm_90 also gets sm_90a (the wgmma attention kernel needs it;
    the driver loads the arch-specific cubin on a 9.0 device, the kernel checks at run time)."""
    out: list[str] = []
    for a in archs:
        for t in [a, "sm_90a"] if a == "sm_90" else [a]:
            if t not in out:
                out.append(t)
    return out


def gencode_flags(archs: list[str]) -> list[str]:
    flags: list[str] = []
    for a in sass_targets(archs):
        num = a[3:]
        flags += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
    top = archs[-1][3:]
    flags += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
    return flags


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_digest(extra: str = "") -> str:
    """One sha256 over every source and header and the flags (the cache key of a build)."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    h.update(" ".join(FLAGS).encode() + extra.encode())
    return h.hexdigest()


def build(archs: str | list[str], out: Path | str, *, nvcc: str | None = None) -> dict[str, Any]:
    """Build into `out` atomically and return the manifest (BadInput / BuildError on failure)."""
    nvcc = nvcc or find_nvcc()
    arch_list = parse_archs(archs, nvcc)
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = FLAGS + gencode_flags(arch_list)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        lib = tmp / LIBRARY
        cmd = [nvcc, *flags, "-o", str(lib), *[str(CSRC / s) for s in SOURCES]]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise BuildError(f"nvcc failed (exit {proc.returncode})", tail=tail)
        manifest = {
            "library": LIBRARY,
            "library_sha256": sha256_file(lib),
            "sources": {s: sha256_file(CSRC / s) for s in SOURCES + HEADERS},
            "source_digest": source_digest(),
            "arch": arch_list,
            "sass": sass_targets(arch_list),
            "ptx": f"compute_{arch_list[-1][3:]}",
            "nvcc": nvcc,
            "nvcc_version": nvcc_version(nvcc),
            "flags": flags,
            "build_seconds": round(time.monotonic() - t0, 2),
            "built_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        _swap_into_place(tmp, out)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Replace `out` by the finished `tmp` with renames only."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    old.rmdir()
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.build", description=__doc__.split("\n")[0])
    ap.add_argument("--arch", required=True, help="comma-separated, e.g. sm_90,sm_120")
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"ok": False, "out": str(args.out)}
    code = 0
    try:
        manifest = build(args.arch, args.out)
        result.update(ok=True, library=str(Path(args.out).resolve() / LIBRARY), manifest=manifest)
    except BadInput as exc:
        code, result["error"] = 2, str(exc)
    except BuildError as exc:
        code, result["error"], result["compiler_tail"] = 1, str(exc), exc.tail
    if args.json:
        print(json.dumps(result, indent=2))
    elif code == 0:
        print(f"built {result['library']} for {', '.join(result['manifest']['arch'])}")
    else:
        print(f"error: {result['error']}", file=sys.stderr)
        if result.get("compiler_tail"):
            print(result["compiler_tail"], file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
