"""First use of `python -m engine` and `ops serve`: every bad value (preset, device, backend from
a flag or DDTREE_ENGINE_BACKENDS, a busy port) is one line on stderr and exit 2, at once, before
the port is bound and before `ops serve` says "serving on"; `--check` reports the effective
backends and where each came from, refuses a tree budget, seed, batch size, thread count or load
delay past its cap, and prints its JSON document for an abbreviated `--chec` too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers.cli import one_line
from helpers.engine_server import REPO, free_port

NO_CUDA = not torch.cuda.is_available()
HUGE = "99999999999999999999"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


ENGINE_BAD = {
    "cuda on a CPU-only torch": (("--device", "cuda"), {}, "CUDA is not available"),
    "unknown preset": (("--preset", "huge"), {}, "invalid choice: 'huge'"),
    "bad backend in the env": ((), {"DDTREE_ENGINE_BACKENDS": "tree_build=gpu"}, "ENGINE_BACKENDS"),
}


def _timed(argv: list[str], env: dict[str, str]) -> tuple[int, float, subprocess.CompletedProcess]:
    """`python ARGV --port P` on a free port P: (P, its seconds, the finished process)."""
    port = free_port()
    t0 = time.monotonic()
    res = _run(*argv, "--port", str(port), env=env)
    return port, time.monotonic() - t0, res


@pytest.fixture(scope="module")
def cuda_refusals() -> dict[str, tuple[int, float, subprocess.CompletedProcess]]:
    """The two "cuda on a CPU-only torch" cases below, `python -m engine` and `ops serve`,
    run together: each imports torch (~3 s of one core) before it finds no GPU."""
    runs = {
        "engine": ["-m", "engine", "--device", "cuda"],
        "ops": ["-m", "ops", "serve", "--device", "cuda"],
    }
    with ThreadPoolExecutor(len(runs)) as pool:
        done = {name: pool.submit(_timed, argv, {}) for name, argv in runs.items()}
        return {name: f.result() for name, f in done.items()}


@pytest.mark.parametrize("case", list(ENGINE_BAD))
def test_engine_refuses_bad_input_at_once_in_one_line(
    case: str, request: pytest.FixtureRequest
) -> None:
    args, env, needle = ENGINE_BAD[case]
    if "cuda" in case and not NO_CUDA:
        pytest.skip("this torch has CUDA")
    if "cuda" in case:
        port, took, res = request.getfixturevalue("cuda_refusals")["engine"]
    else:
        port, took, res = _timed(["-m", "engine", *args], env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert needle in _one_error_line(res.stderr)
    assert took < 30
    assert _port_is_free(port)


def test_engine_on_a_busy_port_is_one_line_exit_2(busy_port: int) -> None:
    res = _run("-m", "engine", "--port", str(busy_port))
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"port {busy_port} on 127.0.0.1 is in use" in _one_error_line(res.stderr)


def test_engine_check_reports_the_effective_backends() -> None:
    env = {"DDTREE_ENGINE_BACKENDS": "tree_build=cpp, accept=cpp"}
    flags = ("--port", str(free_port()), "--backend", "accept=reference")
    res = _run("-m", "engine", "--check", *flags, env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is True
    assert doc["backends"]["tree_build"] == "cpp" and doc["backends"]["accept"] == "reference"
    assert doc["backend_sources"] == {
        "topk": "default",
        "tree_build": "env",
        "accept": "cli",
        "attention": "default",
    }


OPS_BAD = {
    "unknown preset": (("--preset", "huge"), "invalid choice: 'huge'"),
    "cuda on a CPU-only torch": (("--device", "cuda"), "CUDA is not available"),
    "bad backend": (("--backend", "bogus=x"), "bad --backend 'bogus=x'"),
}


@pytest.mark.parametrize("case", list(OPS_BAD))
def test_ops_serve_validates_before_serving(case: str, request: pytest.FixtureRequest) -> None:
    args, needle = OPS_BAD[case]
    if "cuda" in case and not NO_CUDA:
        pytest.skip("this torch has CUDA")
    if "cuda" in case:
        port, _, res = request.getfixturevalue("cuda_refusals")["ops"]
    else:
        port, _, res = _timed(["-m", "ops", "serve", *args], {})
    assert res.returncode == 2, res.stderr[-2000:]
    assert "serving on" not in res.stderr and "Traceback" not in res.stderr
    assert needle in _one_error_line(res.stderr)
    assert _port_is_free(port)


def test_ops_serve_on_a_busy_port_exits_2_with_a_hint(busy_port: int) -> None:
    res = _run("-m", "ops", "serve", "--port", str(busy_port))
    assert res.returncode == 2, res.stderr[-2000:]
    assert "serving on" not in res.stderr
    error, hint = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert error.startswith("error: ") and "in use" in error
    assert hint.startswith("hint: ") and str(busy_port) in hint


def test_cuda_graphs_switch_reaches_the_engine() -> None:
    """`--no-cuda-graphs` (and $DDTREE_ENGINE_CUDA_GRAPHS=0) turn the graphs off; on by default."""
    port = str(free_port())
    on = json.loads(_run("-m", "engine", "--check", "--port", port).stdout)
    off = json.loads(_run("-m", "engine", "--check", "--port", port, "--no-cuda-graphs").stdout)
    env_off = _run(
        "-m", "engine", "--check", "--port", port, env={"DDTREE_ENGINE_CUDA_GRAPHS": "0"}
    )
    assert on["cuda_graphs"] is True and off["cuda_graphs"] is False
    assert json.loads(env_off.stdout)["cuda_graphs"] is False
    help_text = _run("-m", "ops", "serve", "-h").stdout
    assert "--no-cuda-graphs" in help_text


def test_engine_check_abbreviated_still_prints_its_json_document() -> None:
    proc = _run("-m", "engine", "--chec", "--port", "0")
    assert proc.returncode == 2
    assert "--port" in one_line(proc.stderr)
    assert json.loads(proc.stdout) == {
        "ok": False,
        "error": "argument --port: must be in [1, 65535], got 0",
    }


@pytest.mark.parametrize(
    "args",
    [
        ["--budget", HUGE],
        ["--max-budget", HUGE],
        ["--max-budget", "4097"],
        ["--budget", "-1"],
        ["--seed", HUGE],
        ["--max-batch-size", HUGE],
        ["--threads", HUGE],
        ["--load-delay", "1e20"],
    ],
)
def test_engine_check_refuses_a_budget_past_the_cap(args: list[str]) -> None:
    r = _run("-m", "engine", "--preset", "tiny", "--port", "1", *args, "--check")
    assert r.returncode == 2
    assert "--" in one_line(r.stderr) and json.loads(r.stdout)["ok"] is False


def test_engine_check_takes_the_largest_budget() -> None:
    r = _run("-m", "engine", "--preset", "tiny", "--port", "1", "--max-budget", "4096", "--check")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True, r.stderr
