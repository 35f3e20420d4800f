"""CPU test: the attention sources compile for sm_90, sm_90a (H200) and sm_120 (RTX PRO 6000).

The six nvcc compiles (two sources, three archs) are independent single-threaded processes, so
the module starts them two at a time once (`compiled`) and each arch's test reads its own."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "kernels" / "csrc"
ARCHS = ("90", "90a", "120")
SOURCES = ("tree_verify_attention.cu", "kv_compact.cu")

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)"
)


@pytest.fixture(scope="module")
def compiled(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """(arch, source) -> the finished `nvcc -Xptxas -v` compile of that source for that arch."""
    out = tmp_path_factory.mktemp("attn-build")

    def nvcc(job: tuple[str, str]) -> subprocess.CompletedProcess[str]:
        arch, src = job
        cmd = [
            "nvcc",
            "-O3",
            "-std=c++17",
            "-c",
            f"-arch=sm_{arch}",
            "-Xptxas",
            "-v",
            "-o",
            str(out / f"{arch}-{src}.o"),
            str(CSRC / src),
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    jobs = [(arch, src) for arch in ARCHS for src in SOURCES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(nvcc, jobs), strict=True))


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_sources_compile(arch: str, compiled: dict) -> None:
    for src in SOURCES:
        res = compiled[arch, src]
        assert res.returncode == 0, res.stderr[-3000:]
        assert "warning" not in res.stderr.lower(), res.stderr[-3000:]
        spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
        assert spills, "ptxas printed no resource report"
        if src == "tree_verify_attention.cu":  # the wgmma kernel is real only on sm_90a
            wg = re.findall(r"tva_wgmma_kernel.*?Used (\d+) registers", res.stderr, re.S)
            assert wg and all((int(r) > 64) == (arch == "90a") for r in wg), res.stderr[-3000:]
        if arch.startswith("90"):  # the configurations H200 launches must not spill
            assert all(int(s) == 0 for s in spills), res.stderr[-3000:]
