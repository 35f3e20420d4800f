"""kernels.bench honours the memory cap `ops bench --allow-shared` passes it."""

from __future__ import annotations

import pytest

from kernels.bench import apply_memory_cap


def test_no_cap_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDTREE_BENCH_MAX_MEM_GIB", raising=False)
    assert apply_memory_cap() is None


def test_cap_is_reported_and_not_applied_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the gpu test below covers it")
    monkeypatch.setenv("DDTREE_BENCH_MAX_MEM_GIB", "2.5")
    assert apply_memory_cap() == {
        "gib": 2.5,
        "fraction": None,
        "applied": False,
        "reason": "no CUDA device",
    }


@pytest.mark.gpu
def test_cap_limits_allocations(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("DDTREE_BENCH_MAX_MEM_GIB", "1")
    cap = apply_memory_cap()
    assert cap is not None and cap["applied"] and 0 < cap["fraction"] < 1
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
