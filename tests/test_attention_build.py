"""CPU test: the attention sources compile for sm_90, sm_90a (H200) and sm_120 (RTX PRO 6000)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "kernels" / "csrc"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("arch", ["90", "90a", "120"])
def test_attention_sources_compile(arch: str, tmp_path: Path) -> None:
    for src in ("tree_verify_attention.cu", "kv_compact.cu"):
        cmd = ["nvcc", "-O3", "-std=c++17", "-c", f"-arch=sm_{arch}", "-Xptxas", "-v",
               "-o", str(tmp_path / f"{src}.o"), str(CSRC / src)]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "warning" not in res.stderr.lower(), res.stderr[-3000:]
        spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
        assert spills, "ptxas printed no resource report"
        if src == "tree_verify_attention.cu":  # the wgmma kernel is real only on sm_90a
            wg = re.findall(r"tva_wgmma_kernel.*?Used (\d+) registers", res.stderr, re.S)
            assert wg and all((int(r) > 64) == (arch == "90a") for r in wg), res.stderr[-3000:]
        if arch.startswith("90"):  # the configurations H200 launches must not spill
            assert all(int(s) == 0 for s in spills), res.stderr[-3000:]
