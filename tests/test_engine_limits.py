"""Bounded inputs in the engine server, against the real process (tiny preset, CPU, loopback):
a body over the cap is a 413 before it is read, too many prompts are a 400 and a request with
many prompts does not starve a small one, idle half-sent connections neither lock out /health
nor flood the log (under a low fd limit), hostile JSON is a 400, a client that leaves stops its
generation, and /get_server_info names the backends' sources (DDTREE_ENGINE_BACKENDS, flags)
and the server's pid."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers.engine_server import REPO, EngineProcess, free_port, health_status, start_engine

from engine.runtime import EngineSpec, build_decoder
from engine.scheduler import GenRequest, Scheduler, Update

MAX_PROMPTS = 16


@pytest.fixture(scope="module")
def engine(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[EngineProcess]:
    # backends from the environment as a release's service.env sets them; one flag overrides
    monkeypatch_module.setenv("DDTREE_ENGINE_BACKENDS", "tree_build=cpp,accept=cpp")
    args = ("--backend", "accept=reference", "--max-batch-size", "2")
    args += ("--max-prompts-per-request", str(MAX_PROMPTS), "--request-read-timeout", "1")
    eng = start_engine(tmp_path_factory.mktemp("limits"), extra_args=args)
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _state(eng: EngineProcess) -> dict:
    return httpx.get(f"{eng.url}/get_server_info", timeout=5).json()["internal_states"][0]


def _response(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (or the timeout)."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_body_over_the_cap_is_413_before_it_is_read(engine: EngineProcess) -> None:
    with socket.create_connection(("127.0.0.1", engine.port)) as sock:
        t0 = time.monotonic()
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(head + b"Content-Length: 200000000\r\n\r\n" + b'{"prompt": "' + b"x" * 65536)
        assert health_status(engine.url) == 200  # /health answers meanwhile
        reply = _response(sock, 5)
        elapsed = time.monotonic() - t0
    status, _, body = reply.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"connection: close" in status.lower()
    assert "at most 1048576 bytes" in json.loads(body)["error"]["message"]
    assert elapsed < 3, "the server waited for the body"


def test_chunked_body_is_counted_as_it_streams(engine: EngineProcess) -> None:
    """1.25 MiB in chunks and never the last chunk: the 413 can only come from counting."""
    with socket.create_connection(("127.0.0.1", engine.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n%s\r\n" % (16384, b"x" * 16384)
        for _ in range(80):
            sock.sendall(chunk)
        reply = _response(sock, 5)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert health_status(engine.url) == 200


BAD_JSON = {
    "huge integer": b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}",
    "long integer": b'{"prompt": "x", "max_tokens": 1' + b"0" * 4000 + b"}",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "deep object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "NaN temperature": b'{"prompt": "x", "temperature": NaN}',
    "Infinity temperature": b'{"prompt": "x", "temperature": -Infinity}',
    "overflowing temperature": b'{"prompt": "x", "temperature": 1e999}',
    "array body": b"[1, 2]",
    "number body": b"3",
    "string body": b'"prompt"',
    "null body": b"null",
    "not utf-8": b'{"prompt": "\xff\xfe"}',
    "too many prompts": json.dumps({"prompt": ["a"] * (MAX_PROMPTS + 1)}).encode(),
}


@pytest.mark.parametrize("case", list(BAD_JSON))
def test_hostile_json_is_a_400_with_a_json_error(engine: EngineProcess, case: str) -> None:
    r = httpx.post(
        f"{engine.url}/v1/completions",
        content=BAD_JSON[case],
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and 0 < len(err["message"]) < 400
    if case == "too many prompts":
        assert err["code"] == "too_many_prompts" and f"at most {MAX_PROMPTS}" in err["message"]


def test_many_prompts_do_not_starve_a_small_request(engine: EngineProcess) -> None:
    # long enough that a wave of the big request outlasts the small one's HTTP round trip and
    # the wait below, so the bound holds on a busy CPU (at 32 tokens the whole run was 0.6 s)
    big = {"prompt": [f"p{i}" for i in range(MAX_PROMPTS)], "max_tokens": 128, "ignore_eos": True}
    small = {"prompt": "hello", "max_tokens": 8, "ignore_eos": True}

    def post(body: dict) -> tuple[int, float]:
        r = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=120)
        return r.status_code, time.monotonic()

    with ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        big_done = pool.submit(post, big)
        deadline = t0 + 30
        while time.monotonic() < deadline and _state(engine)["num_waiting_reqs"] == 0:
            time.sleep(0.02)  # until the big request fills the batch and queues the rest
        small_status, small_at = post(small)
        big_status, big_at = big_done.result(timeout=120)
    assert small_status == 200 and big_status == 200
    # FIFO would admit the small request after all of the big one's prompts, near its end
    assert small_at - t0 < 0.5 * (big_at - t0), (small_at - t0, big_at - t0)


def test_scheduler_admits_groups_fairly() -> None:
    """In-process, deterministic: six prompts of one request queued before a small request's
    one; with two slots the small one is admitted in the first wave, not after the six."""
    _, dec = build_decoder(EngineSpec(mode="ddtree", max_batch_size=2))
    sched = Scheduler(dec)
    finished: list[str] = []
    done = threading.Event()

    def sink(name: str) -> Callable[[Update], None]:
        def put(u: Update) -> None:
            if u.finished:
                finished.append(name)
                if len(finished) == 7:
                    done.set()

        return put

    for i in range(6):
        sched.submit(GenRequest([1, 2 + i], 8, sink(f"big{i}"), ignore_eos=True, group="big"))
    sched.submit(GenRequest([1, 9], 8, sink("small"), ignore_eos=True, group="small"))
    sched.start()
    try:
        assert done.wait(60)
    finally:
        sched.shutdown()
    assert finished.index("small") <= 1, finished
    assert dec.cache.free_pages == dec.cache.num_pages


def test_a_client_that_leaves_stops_its_generation(engine: EngineProcess) -> None:
    before = _state(engine)["generation_tokens_total"]
    body = json.dumps({"prompt": ["a"] * MAX_PROMPTS, "max_tokens": 400, "ignore_eos": True})
    with socket.create_connection(("127.0.0.1", engine.port)) as sock:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body.encode())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _state(engine)["num_running_reqs"] == 0:
            time.sleep(0.05)
    left = time.monotonic()
    while time.monotonic() - left < 5:
        state = _state(engine)
        if state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0:
            break
        time.sleep(0.05)
    assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0, state
    assert state["generation_tokens_total"] - before < MAX_PROMPTS * 400 // 2
    r = httpx.post(f"{engine.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200


def test_half_sent_request_is_dropped_after_the_read_timeout(engine: EngineProcess) -> None:
    with socket.create_connection(("127.0.0.1", engine.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        t0 = time.monotonic()
        assert _response(sock, 5) == b""  # closed by the server, nothing sent
        assert 0.5 < time.monotonic() - t0 < 4


def test_server_info_reports_backend_sources_and_pid(engine: EngineProcess) -> None:
    info = httpx.get(f"{engine.url}/get_server_info", timeout=5).json()
    assert info["pid"] == engine.proc.pid
    assert info["backends"] == {
        "topk": "reference",
        "tree_build": "cpp",
        "accept": "reference",
        "attention": "torch",
    }
    assert info["backend_sources"] == {
        "topk": "default",
        "tree_build": "env",
        "accept": "cli",
        "attention": "default",
    }
    assert info["limits"]["max_prompts_per_request"] == MAX_PROMPTS


def _engine_with_fd_limit(tmp_path: Path, nofile: int, *args: str) -> EngineProcess:
    port = free_port()
    log_path = tmp_path / f"engine-{port}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))

    def limit_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "--port", str(port), *args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=limit_fds,
        )
    eng = EngineProcess(proc, port, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 90
    while health_status(eng.url) != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            eng.stop()
            raise RuntimeError(f"engine did not start:\n{eng.log_tail()}")
        time.sleep(0.2)
    return eng


def test_idle_half_sent_connections_under_a_low_fd_limit(tmp_path: Path) -> None:
    eng = _engine_with_fd_limit(tmp_path, 48)
    socks: list[socket.socket] = []
    try:
        for _ in range(50):  # more than the fds the server has
            sock = socket.create_connection(("127.0.0.1", eng.port), timeout=5)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        t0 = time.monotonic()
        while health_status(eng.url, timeout=1) != 200:
            assert time.monotonic() - t0 < 3, f"/health locked out:\n{eng.log_tail()}"
        time.sleep(1)  # what the log holds after a while under the same load
        assert health_status(eng.url, timeout=1) == 200
        log = eng.log_path.read_text(errors="replace")
        assert log.count("accept failed") <= 1 and "Traceback" not in log, log[-3000:]
        assert len(log) < 20_000
    finally:
        for sock in socks:
            sock.close()
        eng.stop()
