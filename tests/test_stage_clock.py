"""engine.stage_clock: a step's stage laps add up to the step, and each stage's time lands on the
stage whose work it is (on a GPU: GPU work queued by a stage, without a sync at its lap). On a
CPU engine, an AR or DDTree step's stages (attention inside verify) add up to its wall time."""

from __future__ import annotations

import time

import pytest
import torch

from engine.runtime import EngineSpec, build_decoder
from engine.stage_clock import StageClock
from engine.tokenizer import ByteTokenizer

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run with -m gpu on the device)"
)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_laps_are_host_time_and_add_up() -> None:
    """Each lap is the host time since the previous mark, bracketed by our own clock readings
    around it, so a busy machine (the process descheduled for a while) cannot fail it: lap
    `a` holds the 4 ms of work and nothing before the clock started, `b` none of `a`'s."""
    t0 = time.perf_counter()
    clock = StageClock(None)
    t1 = time.perf_counter()
    _busy(0.004)
    t2 = time.perf_counter()
    clock.lap("a")
    t3 = time.perf_counter()
    clock.lap("b")
    t4 = time.perf_counter()
    _busy(0.008)
    t5 = time.perf_counter()
    clock.lap("c")
    t6 = time.perf_counter()
    stages = clock.finish()
    wall = time.perf_counter() - t0
    assert list(stages) == ["a", "b", "c"]
    assert 0.004 <= t2 - t1 <= stages["a"] <= t3 - t0
    assert 0 <= stages["b"] <= t4 - t2
    assert 0.008 <= t5 - t4 <= stages["c"] <= t6 - t3
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


@pytest.mark.parametrize("mode", ["ar", "ddtree"])
def test_a_cpu_steps_stages_add_up_to_its_wall_time(mode) -> None:
    """engine.stage_clock on a CPU: host-clock laps, one per stage; `attention` is the part of
    verify spent in attention (inside verify, not beside it), so the other stages add up to the
    step's wall time less the step's own bookkeeping outside the clock."""
    spec = EngineSpec("tiny", mode, "cpu", (), max_batch_size=2)
    _, dec = build_decoder(spec)
    tok = ByteTokenizer()
    seqs = [dec.new_sequence(tok.encode(p)) for p in ("Hello there", "The tree of")]
    for s in seqs:
        dec.prefill(s)
    dec.step(seqs)  # warm
    walls, sums = [], []
    for _ in range(8):
        t0 = time.perf_counter()
        st = dec.step(seqs).stages
        walls.append(time.perf_counter() - t0)
        assert all(v >= 0 for v in st.values()), st
        assert st["attention"] <= st["verify"], st
        sums.append(sum(v for k, v in st.items() if k != "attention"))
        want = {"verify", "attention", "commit"}
        if mode == "ddtree":
            want |= {"draft", "topk", "tree_build", "accept"}
        assert set(st) == want, st
    for s in seqs:
        s.blocks.free()
    w, s = sorted(walls)[4], sorted(sums)[4]
    assert s <= w and s >= 0.8 * w - 2e-4, (sums, walls)
