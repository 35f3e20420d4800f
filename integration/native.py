"""Builds and loads `integration/csrc/dropin_ext.cpp`, the drop-ins' CPython extension.

Compiled with g++ on first use against this interpreter's headers and numpy's (it includes
`kernels/csrc/cpu_tree_build.cpp`, the one C++ tree builder), and cached as the C++ baseline
is (`kernels.build.cached`: under `$DDTREE_CACHE`, built once under a file lock, atomically),
keyed by the sha256 of both sources, the flags, the interpreter's extension ABI and the numpy
version. `load()` returns the module with torch.from_numpy set.

`python -m integration.native` builds it ahead of the service's first import of the fork's
module (which otherwise compiles it there, once, in about two seconds) and prints one JSON
document: {"ok", "path"} or {"ok": false, "error"}; exit 0 or 1.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

from kernels.build import cache_dir, cached

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "csrc" / "dropin_ext.cpp"
KERNELS_CSRC = HERE.parent / "kernels" / "csrc"
INCLUDED = KERNELS_CSRC / "cpu_tree_build.cpp"
CXXFLAGS = ["-O3", "-shared", "-fPIC", "-std=c++17", "-fvisibility=hidden"]
MODULE = "_ddtree_dropin"


class NativeBuildError(RuntimeError):
    """The extension could not be compiled (no g++, no Python headers, or g++ failed)."""


def _includes() -> list[str]:
    return [sysconfig.get_paths()["include"], np.get_include(), str(KERNELS_CSRC)]


def library_path() -> Path:
    """The compiled extension for the current sources and interpreter (built if missing)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = b"\0".join(
        [
            SOURCE.read_bytes(),
            INCLUDED.read_bytes(),
            " ".join(CXXFLAGS).encode(),
            suffix.encode(),
            np.__version__.encode(),
        ]
    )
    lib = cache_dir() / f"ddtree_dropin-{hashlib.sha256(key).hexdigest()[:16]}{suffix}"
    return cached(lib, lambda: _compile(lib))


def _compile(lib: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if not cxx or not shutil.which(cxx):
        raise NativeBuildError("g++ not found: the drop-ins' extension needs a C++17 compiler")
    header = Path(_includes()[0]) / "Python.h"
    if not header.is_file():
        raise NativeBuildError(f"no {header}: install this Python's development headers")
    fd, tmp = tempfile.mkstemp(prefix=lib.stem + ".", suffix=".tmp.so", dir=lib.parent)
    os.close(fd)
    try:
        argv = [cxx, *CXXFLAGS, *(f"-I{d}" for d in _includes()), str(SOURCE), "-o", tmp]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise NativeBuildError(f"{cxx} failed on {SOURCE.name}:\n{proc.stderr[-4000:]}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def load() -> ModuleType:
    """The extension module (compiled on first use), ready to build trees."""
    import torch

    path = library_path()
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise NativeBuildError(f"{path}: not loadable as an extension module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.set_from_numpy(torch.from_numpy)
    return mod


def main() -> int:
    try:
        doc = {"ok": True, "path": str(load().__file__)}
    except Exception as exc:  # one line for the caller, whatever went wrong
        doc = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
