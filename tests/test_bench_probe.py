"""The interference probe (`python -m checks.probe`) for real: the reference engine serving on CPU,
slowed down by a real concurrent load that the probe itself starts as the watched command (it
must trip and kill the load's whole process group at once), left alone by an idle command (no
trip), and a service that does not answer (not measured). Then `ops bench --allow-shared`
end to end on `local`: guard (stand-in nvidia-smi), memory cap, probe around the real
`python -m kernels.bench` on the host.

What needs a GPU and is not tested here: a real kernel benchmark heavy enough to slow the
service on a shared GPU (kernels.bench has no CPU-only suite: without CUDA it exits 1 at once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.engine_server import EngineProcess, free_port, start_engine
from helpers.local import Ops

from ops.measure.bench import conclude
from ops.sections.bench import BenchSection

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "fixtures" / "nvidia-smi" / "bin"


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    eng = start_engine(tmp_path_factory.mktemp("probe-engine"))
    yield eng
    eng.stop()


def probe(url: str, *args: str, timeout: float = 120) -> tuple[int, dict]:
    res = subprocess.run(
        [sys.executable, "-m", "checks.probe", "--json", "--url", url, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )
    return res.returncode, json.loads(res.stdout)


def test_real_load_trips_the_probe_and_is_killed_at_once(engine: EngineProcess) -> None:
    load = [
        sys.executable,
        "-m",
        "checks.loadtest",
        "--json",
        "--url",
        engine.url,
        "--concurrency",
        "8",
        "--requests",
        "5000",
        "--output-len",
        "64",
    ]
    t0 = time.monotonic()
    code, doc = probe(engine.url, "--before", "10", "--after", "5", "--", *load)
    assert code == 1 and not doc["ok"]
    assert doc["measured"] and doc["tripped"] and doc["stopped_early"]
    cmd = doc["cmd"]
    assert cmd["killed"] and cmd["rc"] == -9 and not cmd["timed_out"]
    assert cmd["duration_s"] < 20 and time.monotonic() - t0 < 60  # 5000 requests take minutes
    assert not _alive(cmd["pid"])  # the load and its group are gone
    trip = doc["trip"]
    assert trip["rule"] in ("gross", "sustained")
    assert trip["value_ms"] is None or trip["value_ms"] > doc["limit_ms"]
    assert doc["limit_ms"] == pytest.approx(doc["before"]["p50_ms"] * 1.10)
    assert doc["before"]["answered"] == 10 and doc["after"]["n"] == 5
    assert doc["during"]["n"] >= 3 and "command killed" in doc["trip"]["reason"]
    # what `ops bench` makes of such a probe document: NO-GO for interference, in the record's shape
    out = conclude(BenchSection(target="local", gpu=1), doc, {})
    assert (out.code, out.outcome) == (1, "no-go") and out.message.startswith("interference: ")
    section = BenchSection.model_validate(out.section.model_dump(mode="json"))
    assert section.probe.tripped and section.probe.stopped_early and not section.ok
    # the trip is on the recent window (asserted above), not on the whole run's p50, which
    # other work on this machine can leave below the before-p50: only its presence is checked
    assert section.probe.p50_during_ms is not None and section.probe.p50_before_ms is not None


def test_idle_command_does_not_trip(engine: EngineProcess) -> None:
    # The threshold is generous: other jobs share this 2-core machine and move the latency.
    idle = [
        sys.executable,
        "-c",
        "import json, time; time.sleep(1.5); print(json.dumps({'results': []}))",
    ]
    code, doc = probe(
        engine.url, "--threshold", "2.0", "--before", "10", "--after", "3", "--", *idle
    )
    assert code == 0 and doc["ok"], doc.get("trip")
    assert not doc["tripped"] and not doc["cmd"]["killed"] and doc["cmd"]["rc"] == 0
    assert doc["cmd"]["document"] == {"results": []}
    assert doc["during"]["n"] >= 3 and doc["during"]["failed"] == 0


def test_unanswering_service_is_not_measured() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, doc = probe(url, "--before", "3", "--", sys.executable, "-c", "pass")
    assert code == 1 and not doc["measured"] and not doc["tripped"]
    assert doc["cmd"]["rc"] == 0 and doc["during"]["n"] == 0
    assert "connection refused" in doc["unmeasured_reason"]


def test_counters_snapshot(engine: EngineProcess) -> None:
    code, doc = probe(engine.url, "--counters")
    assert code == 0
    states = doc["server_info"]["internal_states"][0]
    assert "step_time_breakdown" in states
    assert any(k.startswith("ddtree:accept_length_count") for k in doc["metrics"])


def test_bench_allow_shared_end_to_end_on_local(tmp_path: Path) -> None:
    ops = Ops(tmp_path)
    ops.configure()  # a quick service (tests/helpers/fake_service.py) under ops's process manager
    ops.env["PATH"] = f"{STANDIN}:{os.environ['PATH']}"
    assert ops.json("service", "start", "local")[0] == 0
    try:  # a huge threshold: the bench's own start (importing torch) loads these 2 cores too
        code, doc = ops.json(
            "bench",
            "local",
            "--gpu",
            "1",
            "--allow-shared",
            "--suite",
            "tree",
            "--batch",
            "1",
            "--probe-threshold",
            "100",
            "--probe-interval",
            "0.02",
        )
    finally:
        ops.stop()  # the service ends (helpers.local.end_services)
    g = doc["guard"]
    assert g["verdict"] == "ok" and g["in_use"] and g["allow_shared"]
    assert g["service_pid"] is not None  # the service's pid, from the process manager
    env = doc["environment"]["bench_env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["DDTREE_BENCH_MAX_MEM_GIB"] == f"{g['memory_cap_mib'] / 1024:g}"
    assert doc["memory_cap"]["env"] == {"DDTREE_BENCH_MAX_MEM_GIB": env["DDTREE_BENCH_MAX_MEM_GIB"]}
    assert doc["bench_run"]["argv"][1:] == [
        "-B",
        "-m",
        "kernels.bench",
        "--json",
        "--suite",
        "tree",
        "--batch",
        "1",
    ]
    assert doc["environment"]["release"].startswith("checkout ")
    p = doc["probe"]
    assert p["measured"] and len(p["before_ms"]) == 20 and p["p50_before_ms"] > 0
    assert p["interval_s"] == 0.02  # --probe-interval: the pause between the probe's requests
    rec = json.loads((Path(doc["run_dir"]) / "record.json").read_text())
    section = BenchSection.model_validate(rec["bench"])
    assert section.probe is not None and section.guard is not None
    if not _cuda():  # no CUDA: the real bench says so and gives no rows: HOLD, not a pass
        assert code == 3 and doc["outcome"] == "hold" and not doc["ok"]
        assert doc["message"].startswith("the bench gave no rows: tree suite: no CUDA device")
        assert rec["outcome"] == "hold" and rec["exit_code"] == 3 and section.rows == []
    else:
        assert code in (0, 1) and (code == 0) == (doc["outcome"] == "pass")


def test_engine_attn_bench_builds_the_engine_as_the_service_runs_it(tmp_path: Path) -> None:
    """`ops bench --suite engine_attn` reads the served reference engine's config from its
    /get_server_info and hands it to kernels.bench (`--engine-*`, `--matmul`): here the real
    engine on CPU, started by ops with a fixed tree budget. A service that does not report an
    engine config (the fake one, as SGLang) cannot be mirrored: one line, exit 2, nothing run."""
    ops = Ops(tmp_path)
    ops.configure_service(
        "{python} -m engine --host {host} --port {port} --preset tiny "
        "--mode ddtree --device cpu --max-budget 0"
    )
    ops.env["PATH"] = f"{STANDIN}:{os.environ['PATH']}"
    assert ops.json("service", "start", "local")[0] == 0
    try:
        code, doc = ops.json(
            "bench",
            "local",
            "--gpu",
            "1",
            "--allow-shared",
            "--suite",
            "engine_attn",
            "--batch",
            "1",
            "--probe-threshold",
            "100",
        )
    finally:
        ops.stop()
    # CPU: no CUDA graphs, fp32 matmuls
    flags = [
        "--engine-preset",
        "tiny",
        "--engine-mode",
        "ddtree",
        "--engine-max-budget",
        "0",
        "--engine-graphs",
        "off",
        "--matmul",
        "fp32",
    ]
    assert doc["engine_flags"] == flags
    argv = doc["bench_run"]["argv"]
    assert argv[1:9] == [
        "-B",
        "-m",
        "kernels.bench",
        "--json",
        "--suite",
        "engine_attn",
        "--batch",
        "1",
    ]
    assert argv[9:] == flags
    # the guard counts the engines the suite builds and the child's own CUDA context
    assert doc["guard"]["memory_needed_mib"] > 2 * 1024 + 2 * 1024
    if not _cuda():  # no CUDA: the suite says so and gives no rows: HOLD
        assert code == 3 and doc["message"].startswith("the bench gave no rows: ")
        # the tiny engine's context holds the default L=64, not 1024: said, and left out
        assert "--prefix-len 1024 left out" in doc["message"]
        assert "engine_attn suite: no CUDA device" in doc["message"]

    (tmp_path / "fake").mkdir()
    ops2 = Ops(tmp_path / "fake")
    ops2.configure()  # helpers/fake_service.py: no /get_server_info
    ops2.env["PATH"] = ops.env["PATH"]
    assert ops2.json("service", "start", "local")[0] == 0
    try:
        res = ops2(
            "bench",
            "local",
            "--gpu",
            "1",
            "--allow-shared",
            "--suite",
            "engine_attn",
            "--batch",
            "1",
        )
    finally:
        ops2.stop()
    assert res.returncode == 2
    assert "--suite engine_attn benches the reference engine as its service runs it" in res.stderr
    assert "Traceback" not in res.stderr
    # the service down: said so, not taken for a service of another kind
    res = ops2(
        "bench", "local", "--gpu", "1", "--allow-shared", "--suite", "engine_attn", "--batch", "1"
    )
    assert res.returncode == 2 and "did not answer" in res.stderr, res.stderr
    assert "is the service up?" in res.stderr and "Traceback" not in res.stderr


def _alive(pid: int) -> bool:
    """A live process (a zombie nobody has reaped yet is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # a thread may end between the listing and the read
            kids += [int(k) for k in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return kids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_command_dies_with_the_probe(sig: signal.Signals) -> None:
    """Ctrl-C / a timeout (TERM) or a hard kill of the probe never leaves the bench running."""
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "checks.probe",
            "--json",
            "--url",
            url,
            "--before",
            "3",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (kids := _children(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(kids) == 1
        cmdline = Path(f"/proc/{kids[0]}/cmdline")
        # wait for the exec: the command itself, not the forked probe (whose own argv holds
        # the command too, so look for the probe's module name to be gone)
        while b"checks.probe" in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.getpgid(kids[0]) == kids[0] != os.getpgid(proc.pid)  # its own group
        os.kill(proc.pid, sig)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(kids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(kids[0])
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.gpu
def test_bench_on_a_free_gpu(tmp_path: Path) -> None:
    """On a GPU host (nvidia-smi real): GPU 0 free, the real bench runs and its rows come back."""
    ops = Ops(tmp_path)
    ops.configure()
    assert ops.json("service", "start", "local")[0] == 0
    try:
        code, doc = ops.json(
            "bench",
            "local",
            "--gpu",
            "0",
            "--suite",
            "tree",
            "--batch",
            "1",
            "--probe-threshold",
            "100",
        )
    finally:
        ops("service", "stop", "local")
    assert code == 0, doc.get("message")
    assert doc["guard"]["verdict"] == "ok" and not doc["guard"]["in_use"]
    assert doc["environment"]["bench"]["CUDA_VISIBLE_DEVICES"] == "0"
    section = BenchSection.model_validate(doc)
    assert {r.impl for r in section.rows} >= {"cuda_events", "cuda_graph", "cpu_python"}
    assert all(r.refcheck is not False for r in section.rows)


def _engine_on_gpu(tmp: Path, device: str, n_gpus: int, bench_gpu: int) -> Ops:
    """`local` with the reference engine (preset small) serving on `device`, started, and an
    inventory that says the host has `n_gpus` GPUs and benches on `bench_gpu`."""
    ops = Ops(tmp)
    ops.configure_service(
        "{python} -m engine --host {host} --port {port} --preset small "
        f"--mode ddtree --device {device}"
    )
    ops.inventory.write_text(
        ops.inventory.read_text().replace(
            "[targets.local.service]",
            f"gpus = {n_gpus}\nbench_gpu = {bench_gpu}\n[targets.local.service]",
        )
    )
    code, doc = ops.json("service", "start", "local")
    assert code == 0, doc
    return ops


@pytest.mark.gpu
def test_guard_and_probe_with_the_engine_serving_on_the_gpu(tmp_path: Path) -> None:
    """#15 on a real GPU: the reference engine serves on GPU 0 (preset small, process manager).
    `--gpu` past the host's GPUs is exit 2 naming the GPUs there are; GPU 0 is refused while
    the service uses it; with --allow-shared a deliberately heavy bench (the attention suite at
    its largest shapes, fp32 SDPA baselines included) slows the service past the default 10%
    threshold, and the probe stops it at once: NO-GO for interference, the three
    distributions in the record."""
    import torch

    n_gpus = torch.cuda.device_count()
    ops = _engine_on_gpu(tmp_path, "cuda", n_gpus, bench_gpu=0)
    try:
        code, doc = ops.json("bench", "local", "--gpu", str(n_gpus + 3), "--suite", "tree")
        assert code == 2 and "GPU" in doc["message"], doc
        assert all(str(i) in doc["message"] for i in range(n_gpus)), doc["message"]
        code, doc = ops.json("bench", "local", "--gpu", "0", "--suite", "tree")
        assert code == 2, doc
        assert "in use by the service" in doc["message"], doc["message"]
        assert "--allow-shared" in doc["hint"], doc
        t0 = time.monotonic()
        code, doc = ops.json(
            "bench", "local", "--gpu", "0", "--allow-shared", "--suite", "attn", "--batch", "64"
        )
        took = time.monotonic() - t0
    finally:
        ops("service", "stop", "local")
    assert (code, doc["outcome"]) == (1, "no-go"), doc.get("message")
    assert doc["message"].startswith("interference: ") and doc["interference"] is True
    p = doc["probe"]
    assert p["tripped"] and p["stopped_early"], p
    assert p["before_ms"] and p["during_ms"] and p["after_ms"] is not None
    rec = json.loads((Path(doc["run_dir"]) / "record.json").read_text())
    section = BenchSection.model_validate(rec["bench"])
    assert rec["outcome"] == "no-go" and section.probe.tripped and not section.ok
    print(f"tripped after {took:.1f} s: p50 {p['p50_before_ms']:.1f} ms before")


@pytest.mark.gpu
def test_bench_on_the_other_gpu_is_isolated(tmp_path: Path) -> None:
    """#15's isolated case, on a host with two GPUs (device kind nvidia-h200-x2): the engine
    serves on GPU 0, `ops bench --gpu 1` runs the same heavy attention suite that trips the
    probe on the service's own GPU, and completes with the service's latency unmoved."""
    import torch

    n_gpus = torch.cuda.device_count()
    if n_gpus < 2:
        pytest.skip(f"needs two GPUs, this host has {n_gpus}")
    ops = _engine_on_gpu(tmp_path, "cuda:0", n_gpus, bench_gpu=1)
    try:
        code, doc = ops.json("bench", "local", "--suite", "attn", "--batch", "64")
    finally:
        ops("service", "stop", "local")
    assert (code, doc["outcome"]) == (0, "pass"), doc.get("message")
    g, p = doc["guard"], doc["probe"]
    assert g["gpu"] == 1 and not g["in_use"] and not g["allow_shared"], g
    assert doc["environment"]["bench_env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert p["measured"] and not p["tripped"] and doc["interference"] is False, p
    assert p["p50_during_ms"] <= 1.10 * p["p50_before_ms"], p
    print(f"p50 {p['p50_before_ms']:.1f} -> {p['p50_during_ms']:.1f} ms during the bench on GPU 1")
