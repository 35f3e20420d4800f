"""`--frontend process` probed as a service: a real engine and its spawned HTTP child, real
signals and real HTTP. A terminal's Ctrl-C (SIGINT to the whole process group) stops both
quietly with exit 0."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers.engine_server import EngineProcess, health_status, start_engine


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _front_end(eng: EngineProcess) -> int:
    front = [k for k in _children(eng.proc.pid) if "spawn_main" in _cmdline(k)]
    assert len(front) == 1
    return front[0]


ARGS = {
    "ctrl-c": ("--frontend", "process"),
    "term": ("--frontend", "process", "--max-batch-size", "4"),
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EngineProcess]]:
    """Each test's own engine (ARGS), both started at once (each imports torch, ~3 s of one
    core); each test stops its own."""
    tmp = tmp_path_factory.mktemp("frontend")
    with ThreadPoolExecutor(len(ARGS)) as pool:
        starts = {k: pool.submit(start_engine, tmp, extra_args=a) for k, a in ARGS.items()}
    started: dict[str, EngineProcess] = {}
    try:
        for name, f in starts.items():  # a failed start is raised once the others are stopped
            started[name] = f.result()
        yield started
    finally:
        for eng in started.values():
            eng.stop()


def test_ctrl_c_to_the_group_stops_engine_and_front_end_quietly(engines) -> None:
    """Ctrl-C in a terminal sends SIGINT to both processes: a requested stop, so exit 0, no
    process or port left, and no KeyboardInterrupt traceback from the front end."""
    eng = engines["ctrl-c"]
    try:
        kids = _children(eng.proc.pid)
        os.kill(_front_end(eng), signal.SIGINT)  # as the kernel delivers it to a group
        os.kill(eng.proc.pid, signal.SIGINT)
        assert eng.proc.wait(timeout=30) == 0
    finally:
        eng.stop()
    deadline = time.monotonic() + 10
    while not all(_gone(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(k) for k in kids)
    assert health_status(eng.url, timeout=1) is None
    log = eng.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]


def test_term_lets_requests_in_flight_finish_as_the_thread_front_end_does(engines) -> None:
    """A TERM (ops service stop or restart) is a graceful stop in both front ends: the port
    closes to new clients and the requests in flight run to their end. The process front end
    aborted them at once instead (200s with finish_reason "abort", truncated outputs)."""
    eng = engines["term"]
    body = {"prompt": [f"prompt {i}" for i in range(16)], "max_tokens": 48, "ignore_eos": True}
    try:
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(httpx.post, f"{eng.url}/v1/completions", json=body, timeout=60)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                info = httpx.get(f"{eng.url}/get_server_info", timeout=10).json()
                if info["internal_states"][0]["num_running_reqs"] > 0:
                    break
                time.sleep(0.05)
            eng.proc.send_signal(signal.SIGTERM)
            r = fut.result(timeout=60)
        assert eng.proc.wait(timeout=30) == 0
    finally:
        eng.stop()
    assert r.status_code == 200
    choices = r.json()["choices"]
    assert [c["finish_reason"] for c in choices] == ["length"] * 16
    assert all(len(c["token_ids"]) == 48 for c in choices)
    assert health_status(eng.url, timeout=1) is None
    assert "Traceback" not in eng.log_path.read_text(errors="replace")
