"""engine.stage_clock: a step's stage laps add up to the step, and each stage's time lands on the
stage whose work it is (on a GPU: GPU work queued by a stage, without a sync at its lap)."""

from __future__ import annotations

import time

import pytest
import torch

from engine.stage_clock import StageClock

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run with -m gpu on the device)"
)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_laps_are_host_time_and_add_up() -> None:
    t0 = time.perf_counter()
    clock = StageClock(None)
    _busy(0.004)
    clock.lap("a")
    clock.lap("b")
    _busy(0.008)
    clock.lap("c")
    stages = clock.finish()
    wall = time.perf_counter() - t0
    assert list(stages) == ["a", "b", "c"]
    assert 0.004 <= stages["a"] < 0.008
    assert stages["b"] < 0.002
    assert 0.008 <= stages["c"] < 0.012
    assert sum(stages.values()) <= wall


@gpu
@needs_cuda
def test_gpu_work_queued_by_a_stage_is_that_stages_time_without_a_sync() -> None:
    """Stage `gpu` queues ~20 ms of GPU work and returns at once; stage `host` then works 5 ms
    on the host while the GPU is still busy; stage `wait` reads a result. The GPU's work is
    the `gpu` stage's (its mark is stamped when that work is done), the host's 5 ms overlap it
    and cost nothing, and the stages add up to the step's wall time."""
    dev = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.current_stream(dev.index)
    x = torch.ones(1, device=dev)
    torch.cuda._sleep(1000)  # warm the sleep kernel up
    torch.cuda.synchronize()
    # cycles for ~20 ms at this GPU's clock: calibrate once
    probe = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe[0].record(stream)
    torch.cuda._sleep(10_000_000)
    probe[1].record(stream)
    probe[1].synchronize()
    cycles = int(10_000_000 * 20.0 / probe[0].elapsed_time(probe[1]))

    t0 = time.perf_counter()
    clock = StageClock(stream)
    torch.cuda._sleep(cycles)
    clock.lap("gpu")
    _busy(0.005)
    clock.lap("host")
    float((x + 1).item())  # a read: waits for the GPU
    clock.lap("wait")
    stages = clock.finish()
    wall = time.perf_counter() - t0
    assert 0.015 < stages["gpu"] < 0.03, stages
    assert stages["host"] < 0.003, stages  # the host's 5 ms ran while the GPU slept
    assert stages["wait"] < 0.003, stages
    assert sum(stages.values()) <= wall + 1e-3
    assert sum(stages.values()) > 0.8 * wall - 0.002
