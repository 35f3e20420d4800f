"""`python -m kernels.selftest`: the CPU builds' checks pass, a wrong answer or a bad library
fails with evidence, bad input is one line and exit 2; on a GPU, a fresh build passes in full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import build as kbuild
from kernels import selftest

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernels.selftest", "--json", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def no_lib_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # run() points DDTREE_KERNELS_LIB at --lib for kernels.cuda_core; restore it afterwards
    monkeypatch.setenv("DDTREE_KERNELS_LIB", "")  # records the original for the undo
    monkeypatch.delenv("DDTREE_KERNELS_LIB")  # (a delenv of an unset name would record none)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def test_cpu_builds_pass_without_a_gpu():
    proc = _run("--shapes", "small", "--seed", "3", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["gpu"].startswith("skipped: ")
    assert doc["seed"] == 3 and doc["torch"] and doc["lib"] is None
    ops = {(o["op"], o["backend"]): o for o in doc["results"]}
    assert set(ops) == {("build_trees", "cpp"), ("greedy_accept", "cpp")}
    for o in ops.values():
        assert o["cases"] >= 8 and o["mismatches"] == 0 and o["first_mismatch"] is None


@pytest.mark.skipif(
    any(os.path.exists(p) for p in selftest.NVIDIA_NODES), reason="a host with an NVIDIA driver"
)
def test_a_host_without_nvidia_devices_checks_the_cpu_builds_without_importing_torch():
    """No driver nodes, nothing asking for a GPU: the GPU checks are skipped without the
    seconds of `import torch` (a deploy's self-test on a CPU host); the installed torch's
    version is still recorded. A named CUDA_VISIBLE_DEVICES still goes to the guard."""
    code = (
        "import json, sys; from kernels import selftest as s; "
        "doc, rc = s.run(None, 'small', 3, False); "
        "print(json.dumps({'rc': rc, 'doc': doc, 'torch_imported': 'torch' in sys.modules}))"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout)
    doc = got["doc"]
    assert got["rc"] == 0 and doc["ok"] and not got["torch_imported"], doc
    assert doc["gpu"].startswith("skipped: no NVIDIA device on this host"), doc["gpu"]
    assert doc["torch"] and doc["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert {o["op"] for o in doc["results"]} == {"build_trees", "greedy_accept"}
    proc = _run("--shapes", "small", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 1 and "asks for a GPU" in proc.stdout, proc.stdout


def test_service_shapes_include_ties_and_the_production_sizes():
    shape = selftest.SHAPES["service"]
    assert shape["depth"] == 15 and shape["budgets"] == (16, 64, 128) and 64 in shape["ks"]
    cases = list(selftest.tree_cases(shape, seed=0))
    assert len(cases) == 2 * 3 * len(selftest.TREE_KINDS)
    # the quantised inputs really hold equal log-probs in a row, so tie-breaking is exercised
    lp = next(c[1] for c in cases if c[0]["inputs"] == "ties_0.25")
    assert any(len(np.unique(row)) < row.size for row in lp.reshape(-1, lp.shape[-1]))


def test_a_wrong_answer_fails_with_evidence(no_lib_env, monkeypatch):
    from kernels import cpu

    real = cpu.build_trees_cpp

    def off_by_one(lp, ids, budget):  # a builder that gets one parent wrong when budget is 64
        trees = real(lp, ids, budget)
        if budget == 64:
            trees.parents[1, 5] += 1
        return trees

    monkeypatch.setattr(cpu, "build_trees_cpp", off_by_one)
    doc, rc = selftest.run(None, "small", 0, require_gpu=False)
    assert rc == 1 and doc["ok"] is False
    build = next(o for o in doc["results"] if o["op"] == "build_trees")
    assert build["mismatches"] == len(selftest.TREE_KINDS)  # every budget-64 case
    ev = build["first_mismatch"]
    assert ev["field"] == "parents" and ev["index"] == [1, 5] and ev["got"] == ev["want"] + 1
    assert ev["case"]["budget"] == 64 and ev["case"]["seed"] == 0


def test_an_op_that_raises_is_a_failure(no_lib_env, monkeypatch):
    from kernels import cpu

    def broken(*args, **kwargs):
        raise RuntimeError("ddtree_cpu_greedy_accept: error 5 (bad tree)")

    monkeypatch.setattr(cpu, "greedy_accept_cpp", broken)
    doc, rc = selftest.run(None, "small", 0, require_gpu=False)
    acc = next(o for o in doc["results"] if o["op"] == "greedy_accept")
    assert rc == 1 and acc["mismatches"] == acc["cases"] > 0
    assert acc["first_mismatch"]["error"].startswith("RuntimeError: ddtree_cpu_greedy_accept")


def test_missing_library_is_bad_input_in_one_line(tmp_path):
    proc = _run("--lib", str(tmp_path / "nope" / "libddtree_kernels.so"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: --lib ")
    assert "no such library file" in proc.stderr and "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["error"] == "bad_input"


def test_other_bad_input_is_exit_2(no_lib_env, tmp_path, capsys):
    assert selftest.main(["--lib", str(tmp_path)]) == 2  # a directory without the library
    assert "no such library file" in capsys.readouterr().err
    assert selftest.main(["--shapes", "huge"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert selftest.main(["--seed", "x"]) == 2


def test_library_that_disagrees_with_its_manifest_fails(no_lib_env, tmp_path):
    lib = tmp_path / "build" / kbuild.LIBRARY
    lib.parent.mkdir()
    lib.write_bytes(b"not the library that was built")
    (lib.parent / kbuild.MANIFEST).write_text(
        json.dumps({"library_sha256": "0" * 64, "source_digest": "f" * 64, "arch": ["sm_90"]})
    )
    doc, rc = selftest.run(selftest.resolve_lib(str(lib.parent)), "small", 0, False)
    assert rc == 1 and doc["ok"] is False
    assert doc["lib"]["path"] == str(lib.resolve())
    assert doc["lib"]["sha256"] == kbuild.sha256_file(lib)
    assert any("!= manifest's" in p for p in doc["problems"])
    assert any("other sources" in p for p in doc["problems"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the guard would pass")
def test_asking_for_a_gpu_where_none_is_fails_the_guard(no_lib_env):
    doc, rc = selftest.run(None, "small", 0, require_gpu=True)
    assert rc == 1 and doc["gpu"].startswith("failed: guard: ")
    assert "--require-gpu" in doc["gpu"] and doc["problems"] == [doc["gpu"]]


@pytest.mark.gpu
def test_full_selftest_of_a_fresh_build(tmp_path):
    major, minor = torch.cuda.get_device_capability(0)
    out = tmp_path / "build"
    built = subprocess.run(
        [sys.executable, "-m", "kernels.build", "--arch", f"sm_{major}{minor}", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    proc = _run(
        "--lib", str(out / kbuild.LIBRARY), "--require-gpu", env={"CUDA_VISIBLE_DEVICES": "0"}
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["gpu"] == "ran" and doc["arch"] == f"sm_{major}{minor}"
    assert doc["lib"]["sha256"] == doc["lib"]["manifest"]["library_sha256"]
    want = {
        "topk_logprobs",
        "build_trees",
        "greedy_accept",
        "greedy_accept_from_logits",
        "tree_verify_attention",
        "compact_kv",
    }
    cuda_ops = {o["op"] for o in doc["results"] if o["backend"] == "cuda"}
    assert cuda_ops == want
    assert all(o["cases"] > 0 and o["mismatches"] == 0 for o in doc["results"])
    assert doc["seconds"] < 60, doc["seconds"]
