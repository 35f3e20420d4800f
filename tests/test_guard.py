"""The GPU guard of `ops bench`, fed by nvidia-smi output recorded on a real 2x H200 host (GPU 1
busy; the busy process also holds a context on GPU 0), replayed by the stand-in
`tests/fixtures/nvidia-smi/bin/nvidia-smi` on PATH: through the real CLI on `local`, over
the real sshd on loopback, and as the decision function on `checks.gpus`' real document.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.local import Ops
from helpers.sshd import write_inventory

from ops.measure.gpu_guard import CAP_ENV, evaluate, memory_needed_mib
from ops.sections.bench import BenchSection

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "fixtures" / "nvidia-smi" / "bin"
H200_UUID1 = "GPU-4a159795-65c4-9dc6-6b6c-855e4f7b58f8"


def gpus_doc(*args: str) -> dict:
    """`python -m checks.gpus --json` as a real process, nvidia-smi being the stand-in."""
    res = subprocess.run(
        [sys.executable, "-m", "checks.gpus", "--json", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PATH": f"{STANDIN}:{os.environ['PATH']}"},
        timeout=60,
    )
    return json.loads(res.stdout)


def decide(doc: dict, gpu: int | None, **kw: object):
    opts = {
        "target": "h200",
        "suites": ["topk", "tree", "accept"],
        "batches": [1, 8, 64],
        "allow_shared": False,
        "max_mem_gib": None,
        "service_pid": None,
    }
    opts.update(kw)
    return evaluate(doc, gpu, **opts)  # type: ignore[arg-type]


def record_of(doc: dict) -> dict:
    return json.loads((Path(doc["run_dir"]) / "record.json").read_text())


def path_without_nvidia_smi(bindir: Path) -> Path:
    """A directory linking every command on this PATH except nvidia-smi (real on a GPU host)."""
    bindir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            dest = bindir / entry.name
            if entry.name != "nvidia-smi" and not dest.exists() and os.access(entry.path, os.X_OK):
                dest.symlink_to(entry.path)
    assert shutil.which("nvidia-smi", path=str(bindir)) is None
    return bindir


@pytest.fixture
def ops(tmp_path: Path):
    o = Ops(tmp_path)
    o.configure()
    o.env["PATH"] = f"{STANDIN}:{os.environ['PATH']}"
    return o


def test_gpu_out_of_range_is_one_line_exit_2_naming_the_gpus(ops: Ops) -> None:
    res = ops("bench", "local", "--gpu", "5")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: local has no GPU 5; its GPUs (PCI bus order): 0, 1"]
    code, doc = ops.json("bench", "local", "--gpu", "9")
    assert code == 2 and doc["outcome"] == "refused" and doc["guard"]["verdict"] == "refused"
    rec = record_of(doc)
    assert rec["outcome"] == "refused" and rec["exit_code"] == 2
    BenchSection.model_validate(rec["bench"])


def test_busy_gpu_refused_without_allow_shared(ops: Ops) -> None:
    code, doc = ops.json("bench", "local", "--gpu", "1")
    assert code == 2 and not doc["ok"]
    g = doc["guard"]
    assert g["in_use"] and [p["pid"] for p in g["processes"]] == [558]
    assert "GPU 1 on local is in use" in doc["message"] and "pid 558" in doc["message"]
    assert "--allow-shared" in doc["hint"] and not doc["rows"]  # refused: no kernel ran
    assert doc["environment"]["gpu_uuid"] == H200_UUID1
    assert doc["environment"]["driver"] == "580.159.04"
    # GPU 0 is busy too: the process opened a 518 MiB context there (see the fixture README)
    code, doc = ops.json("bench", "local", "--gpu", "0")
    assert code == 2 and "518 MiB" in doc["message"]


def test_no_nvidia_smi_is_hold_with_a_record(tmp_path: Path) -> None:
    ops = Ops(tmp_path)
    ops.configure()
    ops.env["PATH"] = str(path_without_nvidia_smi(tmp_path / "tools"))
    code, doc = ops.json("bench", "local", "--gpu", "0")
    assert code == 3 and doc["outcome"] == "hold"
    assert doc["hold_reasons"] == ["no GPU on local (nvidia-smi not found on PATH)"]
    rec = record_of(doc)
    assert rec["outcome"] == "hold" and rec["exit_code"] == 3
    assert BenchSection.model_validate(rec["bench"]).hold_reasons == doc["hold_reasons"]
    res = ops("bench", "local")  # no --gpu, no bench_gpu: still HOLD, there is no GPU at all
    assert res.returncode == 3 and "HOLD: no GPU on local" in res.stderr


def test_no_nvidia_smi_but_the_inventory_counts_the_gpus(tmp_path: Path) -> None:
    """With nvidia-smi missing, the inventory's `gpus` still tells a GPU that is not there
    (exit 2, naming the ones there are) from one the host cannot be asked about (HOLD)."""
    ops = Ops(tmp_path)
    ops.configure()
    text = ops.inventory.read_text()
    ops.inventory.write_text(text.replace("[targets.local]\n", "[targets.local]\ngpus = 2\n", 1))
    ops.env["PATH"] = str(path_without_nvidia_smi(tmp_path / "tools"))
    res = ops("bench", "local", "--gpu", "9")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [
        "error: local has no GPU 9: its inventory says gpus = 2 (0-1); nvidia-smi could not "
        "list them (nvidia-smi not found on PATH)"
    ], res.stderr
    code, doc = ops.json("bench", "local", "--gpu", "1")
    assert code == 3 and doc["hold_reasons"] == ["no GPU on local (nvidia-smi not found on PATH)"]


def test_over_ssh_out_of_range_and_busy(tmp_path: Path, sshd) -> None:
    wrapper = tmp_path / "python"  # the host's python, with the stand-in first on its PATH
    wrapper.write_text(f'#!/bin/sh\nPATH={STANDIN}:$PATH exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    inv = write_inventory(tmp_path / "ops.toml", sshd, tmp_path / "roots", python=str(wrapper))
    (tmp_path / "roots" / "loop").mkdir(parents=True)
    (tmp_path / "roots" / "loop" / "current").symlink_to(REPO)  # the release: this checkout
    env = {**os.environ, "OPS_RUNS_DIR": str(tmp_path / "runs")}

    def ops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ops", *args, "--inventory", str(inv)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    res = ops("bench", "loop", "--gpu", "5")
    assert res.returncode == 2, res.stderr
    assert "error: loop has no GPU 5; its GPUs (PCI bus order): 0, 1" in res.stderr
    res = ops("bench", "loop", "--gpu", "1", "--json")
    assert res.returncode == 2 and json.loads(res.stdout)["guard"]["in_use"] is True


def test_decisions_on_the_recorded_host() -> None:
    doc = gpus_doc("--service-pid", "558")
    g = decide(doc, 1, service_pid=558)
    assert g.verdict == "refused" and g.service_on_gpu is True
    assert "in use by the service" in g.message and "the service's own" in g.message

    g = decide(doc, 1, allow_shared=True)
    need = memory_needed_mib(["topk", "tree", "accept"], [1, 8, 64])
    assert g.verdict == "ok" and g.memory_needed_mib == need
    assert g.memory_cap_mib == 12 * 1024 and g.cap_env == {CAP_ENV: "12"}
    assert any("capped at 12 GiB" in f for f in g.findings)

    g = decide(doc, 1, allow_shared=True, max_mem_gib=200)  # more than the GPU has free
    assert g.verdict == "refused" and "may take at most 50% of it" in g.message

    # the attn suite's engine rows hold every layer's pool at each batch: more with the batch
    # and the prefixes' spread, above its fixed sizes only past them
    attn = [
        memory_needed_mib(["attn"], [1, 8, b], spread)
        for b in (32, 256, 1024)
        for spread in (0, 64)
    ]
    assert attn[0] == attn[1] < attn[2] < attn[3] < attn[4] < attn[5]

    g = decide(doc, 1, allow_shared=True, suites=["accept"], batches=[1024])
    assert g.verdict == "refused" and "need about" in g.message and "--batch" in g.hint

    hidden = json.loads(json.dumps(doc))  # the same host, its processes invisible to us
    for row in hidden["gpus"]:
        row["processes"] = []
    g = decide(hidden, 1)
    assert g.verdict == "refused" and g.in_use
    assert any("processes nvidia-smi does not list" in f for f in g.findings)
    assert decide(hidden, 0).verdict == "ok"  # 527 MiB used: within the allowance

    assert decide({"available": True, "gpus": []}, 0).verdict == "hold"
    g = decide(doc, None)
    assert g.verdict == "refused" and "give --gpu N" in g.message


def test_bench_argv_passes_the_decode_spread_to_the_attn_suite_only() -> None:
    """The decode rows' prefix spread reaches `kernels.bench` when the attn suite runs, and the
    guard's memory estimate counts it; other suites' command lines are as before."""
    from ops.measure.bench import BenchOptions, bench_argv

    attn = BenchOptions(gpu=0, suites=["attn"], batches=[1, 32], decode_spread=16)
    assert bench_argv("py", attn)[-2:] == ["--decode-spread", "16"]
    assert "--decode-spread" not in bench_argv("py", attn.model_copy(update={"decode_spread": 0}))
    tree = BenchOptions(gpu=0, suites=["tree"], batches=[1], decode_spread=16)
    assert bench_argv("py", tree) == [
        "py",
        "-B",
        "-m",
        "kernels.bench",
        "--json",
        "--suite",
        "tree",
        "--batch",
        "1",
    ]
