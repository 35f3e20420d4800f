"""The engine's matmul precision (`--matmul`) applies inside its own forwards only: torch's
TF32 flag is process-wide, and code sharing the process (a test, a bench) keeps its own."""

from __future__ import annotations

import pytest
import torch

from engine.runtime import EngineSpec, build_decoder, generate


@pytest.mark.parametrize("outside", [False, True])
def test_the_flag_is_restored_after_every_forward(outside: bool) -> None:
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    try:
        flags.allow_tf32 = outside
        _, dec = build_decoder(EngineSpec(preset="tiny", device="cpu", mode="ddtree"))
        assert flags.allow_tf32 is outside
        seen = []
        with dec.model.precision():
            seen.append(flags.allow_tf32)
        assert seen == [False]  # a CPU model computes fp32 whatever --matmul says
        assert flags.allow_tf32 is outside
        generate(dec, [[1, 2, 3, 4]], 4)
        assert flags.allow_tf32 is outside
    finally:
        flags.allow_tf32 = before


def test_a_bad_matmul_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="matmul"):
        build_decoder(EngineSpec(preset="tiny", device="cpu", matmul="bf16"))
