"""Shared core of the CUDA bindings: load the kernel library, validate tensors, launch, raise.

The library comes from `$DDTREE_KERNELS_LIB` if set, else it is built on first use with
`kernels.build` for the current device's arch into `$DDTREE_CACHE/cuda/<arch>-<digest>/`
(default `~/.cache/ddtree-ops/`), keyed by the sha256 of the sources, under a file lock so
concurrent processes build once. Op modules (`kernels.cuda`, `kernels.cuda_attention`)
declare their C functions with `declare`, check arguments with `check_tensor`, and launch with
`launch`, which turns a non-zero return code into a `KernelError` naming the op. A library
whose `ddtree_abi_version()` is not `ABI_VERSION` is refused at load (`AbiMismatch`).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kernels import build as _build

__all__ = [
    "ABI_VERSION",
    "AbiMismatch",
    "KernelError",
    "check_same_device",
    "check_tensor",
    "declare",
    "launch",
    "library",
    "library_path",
    "on_device",
    "ptr",
    "stream_of",
]

LIB_ENV = "DDTREE_KERNELS_LIB"
ABI_VERSION = 2  # DDTREE_ABI_VERSION of kernels/csrc/ddtree_kernels.h
c_i32, c_i64, c_ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p


class AbiMismatch(RuntimeError):
    """The loaded library was built from sources with another C ABI than these bindings."""


class KernelError(RuntimeError):
    """A kernel launcher returned a CUDA error code."""

    def __init__(self, op: str, code: int, message: str) -> None:
        super().__init__(f"{op}: CUDA error {code}: {message}")
        self.op, self.code, self.cuda_message = op, code, message


def device_arch(device: torch.device | int | None = None) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def library_path(arch: str | None = None) -> Path:
    """$DDTREE_KERNELS_LIB, else the cached build for `arch` (default: this device), built once."""
    env = os.environ.get(LIB_ENV)
    if env:
        path = Path(env)
        if path.is_dir():
            path = path / _build.LIBRARY
        if not path.is_file():
            raise FileNotFoundError(f"{LIB_ENV}={env}: no such library")
        return path
    arch = arch or device_arch()
    out = _build.cache_dir() / "cuda" / f"{arch}-{_build.source_digest()[:16]}"
    return _build.cached(out, lambda: _build.build([arch], out)) / _build.LIBRARY


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded kernel library (loaded once per process), its ABI version checked."""
    path = library_path()
    lib = ctypes.CDLL(str(path))
    lib.ddtree_error_string.restype = ctypes.c_char_p
    lib.ddtree_error_string.argtypes = [c_i32]
    lib.ddtree_abi_version.restype = c_i32
    version = lib.ddtree_abi_version()
    if version != ABI_VERSION:
        raise AbiMismatch(
            f"{path}: C ABI version {version}, these bindings need {ABI_VERSION}"
            f" (rebuild it with `python -m kernels.build`, or unset {LIB_ENV})"
        )
    return lib


@functools.cache
def declare(name: str, argtypes: tuple[Any, ...]) -> Any:
    """The C function `name` of the library with its argument types set (returns int)."""
    fn = getattr(library(), name)
    fn.argtypes = list(argtypes)
    fn.restype = c_i32
    return fn


def launch(op: str, fn: Any, *args: Any) -> None:
    """Call a launcher; a non-zero code becomes KernelError(op, code, CUDA's message)."""
    rc = fn(*args)
    if rc != 0:
        msg = library().ddtree_error_string(rc).decode(errors="replace")
        raise KernelError(op, rc, msg)


def on_device(x: Any, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x as a contiguous tensor on `device` (of `dtype`, else its own): x itself when it is one
    already (a CUDA stage's inputs usually are, and each skipped conversion is a dispatcher
    call in a host-bound decode step)."""
    if (
        isinstance(x, torch.Tensor)
        and x.device == device
        and (dtype is None or x.dtype == dtype)
        and x.is_contiguous()
    ):
        return x
    return torch.as_tensor(x).to(device, dtype).contiguous()


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None or t.numel() == 0 else t.data_ptr()


def stream_of(t: torch.Tensor) -> int:
    """The raw handle of the current stream on t's device."""
    return torch.cuda.current_stream(t.device.index).cuda_stream  # an int: torch's fast path


def check_tensor(
    op: str,
    name: str,
    t: Any,
    *,
    dtypes: Sequence[torch.dtype],
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
) -> torch.Tensor:
    """Check that `t` is a contiguous CUDA tensor of an allowed dtype and shape (ValueError)."""
    # the common case in one expression (a launch checks up to a dozen tensors, and a batch-1
    # decode step is host-bound: ~1 us a check instead of ~4); any miss takes the full checks
    # below, which name what is wrong
    if (
        type(t) is torch.Tensor
        and t.is_cuda
        and t.dtype in dtypes
        and (
            t.shape == shape
            if shape is not None and None not in shape
            else shape is None and (ndim is None or t.dim() == ndim)
        )
        and t.is_contiguous()
    ):
        return t
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{op}: {name}: expected a CUDA tensor, got device {t.device}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{op}: {name}: expected dtype {allowed}, got {t.dtype}")
    want_ndim = len(shape) if shape is not None else ndim
    if want_ndim is not None and t.dim() != want_ndim:
        raise ValueError(f"{op}: {name}: expected {want_ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None and any(
        w is not None and w != s for w, s in zip(shape, t.shape, strict=True)
    ):
        want = tuple("*" if w is None else w for w in shape)
        raise ValueError(f"{op}: {name}: expected shape {want}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name}: expected a contiguous tensor")
    return t


def check_same_device(op: str, **tensors: torch.Tensor) -> torch.device:
    """All tensors on one CUDA device; returns it."""
    items = list(tensors.items())
    dev = items[0][1].device
    for name, t in items[1:]:
        if t.device != dev:
            raise ValueError(f"{op}: {name}: on {t.device}, expected {dev} like {items[0][0]}")
    return dev
