"""kernels.build: a real nvcc build for sm_90 + sm_120, its manifest and ABI, and its failures."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import build

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA toolkit)")

ABI = (
    "ddtree_abi_version",
    "ddtree_error_string",
    "ddtree_topk_logprobs",
    "ddtree_build_trees",
    "ddtree_greedy_accept",
    "ddtree_greedy_accept_from_logits",
)
ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernels.build", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
        timeout=600,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("k") / "lib"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier build")
    proc = _cli("--arch", "sm_120,sm_90", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, json.loads(proc.stdout)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_json_and_manifest(built):
    out, doc = built
    assert doc["ok"] is True and Path(doc["library"]) == out / "libddtree_kernels.so"
    m = json.loads((out / "manifest.json").read_text())
    assert m == doc["manifest"]
    assert m["arch"] == ["sm_90", "sm_120"] and m["ptx"] == "compute_120"
    assert m["library_sha256"] == _sha(out / "libddtree_kernels.so")
    assert set(m["sources"]) == set(build.SOURCES + build.HEADERS)
    for name, digest in m["sources"].items():
        assert digest == _sha(build.CSRC / name)
    assert "release" in m["nvcc_version"] and m["built_at"].endswith("+00:00")
    flags = " ".join(m["flags"])
    for gc in (
        "arch=compute_90,code=sm_90",
        "arch=compute_120,code=sm_120",
        "arch=compute_120,code=compute_120",
    ):
        assert gc in flags
    assert not (out / "stale.txt").exists()  # DIR replaced as a whole
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".lib.")]  # no temp left


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_library_exports_the_abi(built):
    out, _ = built
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(out / "libddtree_kernels.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {line.split()[-1] for line in nm.splitlines() if " T " in line}
    assert set(ABI) <= exported


def test_real_sass_for_each_arch(built):
    out, _ = built
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("needs cuobjdump")
    listing = subprocess.run(
        [cuobjdump, "--list-elf", str(out / "libddtree_kernels.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "sm_90" in listing and "sm_120" in listing


def test_unknown_arch_exits_2(tmp_path):
    proc = _cli("--arch", "sm_90,sm_999", "--out", str(tmp_path / "x"), "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and "sm_999" in doc["error"]
    assert not (tmp_path / "x").exists()
    assert _cli("--arch", "compute_90", "--out", str(tmp_path / "y")).returncode == 2


def test_missing_nvcc_exits_2(tmp_path):
    env = dict(os.environ, NVCC=str(tmp_path / "no-such-nvcc"))
    proc = _cli("--arch", "sm_90", "--out", str(tmp_path / "x"), "--json", env=env)
    assert proc.returncode == 2 and "nvcc" in json.loads(proc.stdout)["error"]


def test_compiler_error_exits_1_and_keeps_old_dir(tmp_path, monkeypatch, capsys):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "broken.cu").write_text('extern "C" int f(void) { return undefined_name; }\n')
    monkeypatch.setattr(build, "CSRC", csrc)
    monkeypatch.setattr(build, "SOURCES", ["broken.cu"])
    monkeypatch.setattr(build, "HEADERS", [])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old build")
    assert build.main(["--arch", "sm_90", "--out", str(out), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "undefined_name" in doc["compiler_tail"]
    assert (out / "keep.txt").read_text() == "old build"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csrc", "out"]


def test_abi_version_and_unknown_algorithms(built):
    # No GPU needed: the launchers check the algorithm before any CUDA call.
    import ctypes

    from kernels.cuda_core import ABI_VERSION

    lib = ctypes.CDLL(str(built[0] / "libddtree_kernels.so"))
    assert lib.ddtree_abi_version() == ABI_VERSION
    null7 = [None] * 7
    for algo in (-1, 4):  # DDTREE_TREE_* is 0..3
        assert lib.ddtree_build_trees(None, None, 1, 15, 8, 8, *null7, algo, None) == 1
    splits, ws = ctypes.c_int(), ctypes.c_size_t()
    for algo in (-1, 5):  # DDTREE_ATTN_* is 0..4
        rc = lib.ddtree_tree_verify_attention_plan(
            1, algo, 1, 8, 8, 8, 64, 0, ctypes.byref(splits), ctypes.byref(ws)
        )
        assert rc == 1
