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


def test_a_bad_matmul_from_the_environment_is_one_line_and_exit_2() -> None:
    import os
    import subprocess
    import sys

    from helpers.sshd import free_port

    env = {**os.environ, "DDTREE_ENGINE_MATMUL": "bf16"}
    cmd = [sys.executable, "-m", "engine", "--check", "--port", str(free_port())]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res
    assert "DDTREE_ENGINE_MATMUL='bf16'" in res.stderr and "Traceback" not in res.stderr
    ok = subprocess.run(
        [*cmd[:-1], str(free_port())],
        env={**env, "DDTREE_ENGINE_MATMUL": "fp32"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and '"matmul": "fp32"' in ok.stdout, ok
