"""CPU tests of the CUDA bindings: the ABI check at load and argument errors before any launch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernels import cuda, cuda_attention, cuda_core  # noqa: E402

FAKE = """
extern "C" int ddtree_abi_version(void) { return %d; }
extern "C" const char* ddtree_error_string(int) { return "fake"; }
"""


@pytest.fixture
def fresh_library(monkeypatch):
    cuda_core.library.cache_clear()
    cuda_core.declare.cache_clear()
    yield monkeypatch
    cuda_core.library.cache_clear()
    cuda_core.declare.cache_clear()


def _fake_lib(tmp_path: Path, version: int) -> Path:
    src, lib = tmp_path / "fake.cpp", tmp_path / f"libfake{version}.so"
    src.write_text(FAKE % version)
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_library_of_another_abi_is_refused(tmp_path, fresh_library):
    fresh_library.setenv(cuda_core.LIB_ENV, str(_fake_lib(tmp_path, cuda_core.ABI_VERSION - 1)))
    with pytest.raises(cuda_core.AbiMismatch, match="C ABI version 1, these bindings need 2"):
        cuda_core.library()
    fresh_library.setenv(cuda_core.LIB_ENV, str(_fake_lib(tmp_path, cuda_core.ABI_VERSION)))
    assert cuda_core.library().ddtree_abi_version() == cuda_core.ABI_VERSION


def test_unknown_algorithms_are_value_errors():
    lp, ids = torch.zeros(1, 2, 2), torch.zeros(1, 2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"build_trees: algo must be one of \['auto', 'levels'"):
        cuda.build_trees(lp, ids, 4, algo="v6")
    with pytest.raises(ValueError, match="planned_splits: algo must be one of"):
        cuda_attention.planned_splits(1, 8, 65, 64, algo="mma21")
    with pytest.raises(ValueError, match="planned_splits: algo 'mma_sync_32' needs bfloat16"):
        cuda_attention.planned_splits(1, 8, 65, 64, algo="mma_sync_32", dtype=torch.float32)


def test_attention_arguments_are_checked_like_the_other_ops():
    # One binding style: the kernels.cuda_core checks, ValueError (never TypeError).
    q = torch.zeros(2, 8, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="tree_verify_attention: q: expected a torch.Tensor"):
        cuda_attention.tree_verify_attention([0.0], q, q, q, q, q, 0.1)
    with pytest.raises(ValueError, match="tree_verify_attention: q: expected a CUDA tensor"):
        cuda_attention.tree_verify_attention(q, q, q, q, q, q, 0.1)
    with pytest.raises(ValueError, match="compact_kv: kv_cache: expected a CUDA tensor"):
        cuda_attention.compact_kv(q, q, q, q)


def test_on_device_passes_a_ready_tensor_through_and_converts_anything_else():
    ready = torch.arange(6, dtype=torch.int64)
    assert cuda_core.on_device(ready, torch.device("cpu")) is ready
    assert cuda_core.on_device(ready, torch.device("cpu"), torch.int64) is ready
    f = cuda_core.on_device(ready, torch.device("cpu"), torch.float32)
    assert f.dtype == torch.float32 and torch.equal(f, ready.float())
    strided = torch.arange(12).view(3, 4).t()
    c = cuda_core.on_device(strided, torch.device("cpu"))
    assert c is not strided and c.is_contiguous() and torch.equal(c, strided)
    from_list = cuda_core.on_device([1, 2, 3], "cpu", torch.int64)
    assert from_list.dtype == torch.int64 and from_list.tolist() == [1, 2, 3]
