"""The reference engine as a real process: OpenAI client (plain and streaming), bad input -> 400
while the server keeps serving, /metrics parses, concurrent requests are batched, AR == DDTree
through HTTP."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from helpers.engine_server import EngineProcess, health_status, start_engine
from prometheus_client.parser import text_string_to_metric_families

from engine.runtime import EngineSpec, build_decoder, generate
from engine.stats import STAGES
from engine.tokenizer import ByteTokenizer

MODEL = "ddtree-reference"
TOK = ByteTokenizer()
PROMPTS = ["Hello, world!", "The capital of France is", "def f(x):", "日本語", ""]


@pytest.fixture(scope="module", params=["thread", "process"])
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    """The engine serving HTTP from a thread beside its scheduler, and from a front-end process
    of its own (--frontend process, engine.engine_proc): every test below runs against both."""
    args = ("--max-batch-size", "4", "--frontend", request.param)
    eng = start_engine(tmp_path_factory.mktemp("engine"), extra_args=args)
    eng.frontend = request.param  # type: ignore[attr-defined]
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def client(engine: EngineProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{engine.url}/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def ar_reference() -> dict[str, list[int]]:
    """Greedy AR outputs computed in this process (32 tokens each)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, dec = build_decoder(EngineSpec(mode="ar"))
        outs, _ = generate(dec, [TOK.encode(p) for p in PROMPTS], 32)
    finally:
        torch.set_num_threads(threads)
    return dict(zip(PROMPTS, outs, strict=True))


def _post(engine: EngineProcess, body: object, raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(f"{engine.url}/v1/completions", content=content, headers=headers, timeout=60)


def test_openai_client_completions_match_ar(client: openai.OpenAI, ar_reference) -> None:
    for prompt in PROMPTS:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
        choice = r.choices[0]
        ids = choice.model_extra["token_ids"]
        assert ids == ar_reference[prompt][: len(ids)]
        assert len(ids) == 32 or choice.finish_reason == "stop"
        assert choice.text == TOK.decode(ids)
        assert r.usage.completion_tokens == len(ids)
        assert r.usage.prompt_tokens == len(TOK.encode(prompt))


def test_token_id_prompt_and_prompt_list(client: openai.OpenAI, ar_reference) -> None:
    ids = TOK.encode(PROMPTS[0])
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=8)
    assert r.choices[0].model_extra["token_ids"] == ar_reference[PROMPTS[0]][:8]
    r = client.completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=8)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c, p in zip(r.choices, PROMPTS[:3], strict=True):
        assert c.model_extra["token_ids"] == ar_reference[p][:8]


def test_openai_client_streaming(client: openai.OpenAI, ar_reference) -> None:
    prompt = PROMPTS[1]
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, ids, reasons, usage = "", [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            ids += c.model_extra["token_ids"]
            reasons.append(c.finish_reason)
    want = ar_reference[prompt]
    assert ids == want[: len(ids)] and (len(ids) == 32 or reasons[-1] == "stop")
    assert text == TOK.decode(ids)
    assert reasons[-1] in ("length", "stop") and all(r is None for r in reasons[:-1])
    assert len(reasons) > 1  # really streamed in pieces
    assert usage is not None and usage.completion_tokens == len(ids)


def test_stop_string(client: openai.OpenAI, ar_reference) -> None:
    # the first clean two-character piece (no U+FFFD) past the start of some output
    prompt, full, at = next(
        (p, t, i)
        for p in PROMPTS
        for t in [TOK.decode(ar_reference[p])]
        for i in range(2, len(t) - 1)
        if "\ufffd" not in t[i : i + 2]
    )
    stop = full[at : at + 2]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(stop)]
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=32, stop=stop, stream=True
        )
        if c.choices
    )
    assert streamed == r.choices[0].text


BAD = {
    "invalid json": (None, b'{"prompt": "x",'),
    "not an object": ([1, 2], None),
    "missing prompt": ({"max_tokens": 4}, None),
    "empty prompt list": ({"prompt": []}, None),
    "token id out of range": ({"prompt": [1, 99999]}, None),
    "max_tokens zero": ({"prompt": "x", "max_tokens": 0}, None),
    "max_tokens huge": ({"prompt": "x", "max_tokens": 10**9}, None),
    "max_tokens not int": ({"prompt": "x", "max_tokens": "8"}, None),
    "temperature > 0": ({"prompt": "x", "temperature": 0.7}, None),
    "prompt too long": ({"prompt": "x" * 600}, None),
    "prompt + max_tokens too long": ({"prompt": "x" * 400, "max_tokens": 200}, None),
    "bad stop": ({"prompt": "x", "stop": [3]}, None),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_400_and_server_keeps_serving(engine: EngineProcess, case: str) -> None:
    body, raw = BAD[case]
    r = _post(engine, body, raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    ok = _post(engine, {"prompt": "still there?", "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) == 2


def test_openai_client_sees_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, temperature=1.0)


def test_health_models_server_info(engine: EngineProcess) -> None:
    assert health_status(engine.url) == 200
    r = httpx.get(f"{engine.url}/health_generate", timeout=60)
    assert r.status_code == 200 and len(r.json()["token_ids"]) == 1
    models = httpx.get(f"{engine.url}/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    info = httpx.get(f"{engine.url}/get_server_info").json()
    assert info["mode"] == "ddtree" and info["preset"] == "tiny"
    # the process holding the model is the one started (its pid is the service's, also when
    # HTTP is served by a child)
    assert info["frontend"] == engine.frontend and info["pid"] == engine.proc.pid
    assert info["backends"] == {
        "topk": "reference",
        "tree_build": "reference",
        "accept": "reference",
        "attention": "torch",
    }
    assert info["config"]["model"]["vocab_size"] == 258
    # the tiny preset's tree budget is fixed: the same at every batch size
    assert set(info["budget_by_batch"]) == {info["config"]["engine"]["budget"]}
    gc_info = info["gc"]  # loading froze what it built; collections counted per generation
    assert gc_info["frozen_objects"] > 1000 and len(gc_info["collections"]) == 3
    assert all(x >= 0 for x in gc_info["pause_total_s"] + gc_info["pause_max_s"])
    state = info["internal_states"][0]
    assert state["avg_spec_accept_length"] > 1.0
    steps = state["step_time_breakdown"]
    assert steps and all(
        set(v["mean_s"]) >= {"draft", "topk", "tree_build", "verify", "accept", "commit"}
        for v in steps.values()
    )


def test_concurrent_requests_are_batched(engine: EngineProcess, ar_reference) -> None:
    def one(prompt: str) -> list[int]:
        r = _post(engine, {"prompt": prompt, "max_tokens": 32})
        assert r.status_code == 200
        return r.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        outs = list(pool.map(one, PROMPTS * 2))
    for prompt, ids in zip(PROMPTS * 2, outs, strict=True):
        assert ids == ar_reference[prompt][: len(ids)]
    info = httpx.get(f"{engine.url}/get_server_info").json()["internal_states"][0]
    assert info["max_batch_size_seen"] > 1
    assert any(int(b) > 1 for b in info["step_time_breakdown"])
    # the batch's length spread (longest sequence - shortest, summed over the steps): prompts
    # of different lengths stand apart; one sequence alone has none
    spread = {int(b): v["spread_sum"] for b, v in info["step_time_breakdown"].items()}
    assert spread.get(1, 0) == 0 and any(v > 0 for b, v in spread.items() if b > 1), spread


def test_metrics_parse(engine: EngineProcess) -> None:
    _post(engine, {"prompt": "metrics", "max_tokens": 8})
    r = httpx.get(f"{engine.url}/metrics")
    assert r.status_code == 200
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:spec_accept_length",
        "sglang:generation_tokens",
        "ddtree:stage_seconds",
        "ddtree:accept_length",
    ):
        assert name in fams, name
    assert fams["ddtree:stage_seconds"].type == "histogram"
    stages = {s.labels.get("stage") for s in fams["ddtree:stage_seconds"].samples}
    assert stages == set(STAGES)
    tokens = [s.value for s in fams["sglang:generation_tokens"].samples]
    assert tokens and tokens[0] >= 8
    for fam in fams.values():  # every sample names the model
        assert all(s.labels.get("model_name") == MODEL for s in fam.samples), fam.name
    # each histogram series: cumulative buckets, the last (+Inf) equal to its _count
    steps = sum(s.value for s in fams["ddtree:steps"].samples)
    assert steps >= 1
    for name, key in (("ddtree:stage_seconds", "stage"), ("ddtree:accept_length", None)):
        series: dict[str | None, list] = {}
        for s in fams[name].samples:
            series.setdefault(s.labels.get(key) if key else None, []).append(s)
        for label, samples in series.items():
            bucket = [s for s in samples if s.name.endswith("_bucket")]
            buckets = [s.value for s in bucket]
            count = next(s.value for s in samples if s.name.endswith("_count"))
            assert buckets == sorted(buckets) and buckets[-1] == count, (name, label)
            assert bucket[-1].labels["le"] == "+Inf", (name, label)
            if key:  # a stage is observed at most once per decode step
                assert count <= steps, (name, label)
    mean = fams["sglang:spec_accept_length"].samples[0].value
    acc = {s.name: s.value for s in fams["ddtree:accept_length"].samples}
    assert mean == pytest.approx(
        acc["ddtree:accept_length_sum"] / acc["ddtree:accept_length_count"]
    )


@pytest.mark.parametrize("frontend", ["thread", "process"])
def test_ar_server_matches_and_health_is_503_while_loading(tmp_path, ar_reference, frontend):
    """While the model loads, /health is 503 and /get_server_info answers at once (ready
    false), from either front end; then AR serves its reference outputs."""
    # 1.5 s of 503 (the load delay) is 15 of this loop's polls, to see one and ask for the info
    args = ("--load-delay", "1.5", "--frontend", frontend)
    eng = start_engine(tmp_path, mode="ar", extra_args=args, wait_healthy=False)
    try:
        deadline = time.monotonic() + 60
        seen, info = set(), None
        while time.monotonic() < deadline:
            seen.add(status := health_status(eng.url, timeout=1))
            if status == 503 and info is None:
                info = httpx.get(f"{eng.url}/get_server_info", timeout=2).json()
            if 200 in seen:
                break
            time.sleep(0.1)
        assert 503 in seen and 200 in seen, eng.log_tail()
        assert info is not None and info["ready"] is False and info["frontend"] == frontend
        r = httpx.post(f"{eng.url}/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 32})
        assert r.json()["choices"][0]["token_ids"] == ar_reference[PROMPTS[1]]
        assert httpx.get(f"{eng.url}/get_server_info").json()["mode"] == "ar"

        def sample(seed: int) -> list[int]:
            body = {"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 5.0, "seed": seed}
            r = httpx.post(f"{eng.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["token_ids"]

        # ar mode also samples (temperature > 0), reproducibly for a given seed
        assert sample(7) == sample(7)
        assert len({tuple(sample(s)) for s in range(4)}) > 1
        assert sample(7) != ar_reference[PROMPTS[1]][:16]
    finally:
        eng.stop()


def test_bad_requests_do_not_disturb_one_in_flight(engine: EngineProcess, ar_reference) -> None:
    prompt = PROMPTS[2]
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_post, engine, {"prompt": prompt, "max_tokens": 32, "ignore_eos": True})
        for body, raw in BAD.values():
            assert _post(engine, body, raw).status_code == 400
        r = long.result(timeout=60)
    assert r.status_code == 200
    ids = r.json()["choices"][0]["token_ids"]
    assert ids[: len(ar_reference[prompt])] == ar_reference[prompt][: len(ids)]


def test_client_leaving_mid_stream_is_harmless(engine: EngineProcess) -> None:
    def info() -> dict:
        return httpx.get(f"{engine.url}/get_server_info").json()["internal_states"][0]

    before = info()["generation_tokens_total"]
    body = {"prompt": "bye", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = info()
        if state["num_running_reqs"] == 0:
            break
        time.sleep(0.2)
    assert state["num_running_reqs"] == 0
    assert state["generation_tokens_total"] - before < 400  # cancelled, not run to the end
    assert httpx.get(f"{engine.url}/health_generate", timeout=60).status_code == 200


def test_cli_refuses_a_bad_backend() -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "engine", "--port", "1", "--backend", "tree_build=gpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "bad --backend" in r.stderr


@pytest.fixture(scope="module")
def failing_loads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EngineProcess]]:
    """An engine per front end given weights that are not a safetensors file, both started at
    once (each imports torch before it fails, ~3 s of one core): front end -> its process."""
    tmp = tmp_path_factory.mktemp("bad-weights")
    bad = tmp / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file" * 10)
    engines = {
        frontend: start_engine(
            tmp, extra_args=("--weights", str(bad), "--frontend", frontend), wait_healthy=False
        )
        for frontend in ("thread", "process")
    }
    try:
        yield engines
    finally:
        for eng in engines.values():
            eng.stop()


@pytest.mark.parametrize("frontend", ["thread", "process"])
def test_a_model_that_fails_to_load_ends_the_process_with_exit_1(failing_loads, frontend) -> None:
    """Weights that are not a safetensors file pass the flag checks (the file exists) and fail
    in loading: the server stops and the process exits 1 with the reason on stderr, so a
    service manager sees the failure at once instead of waiting on /health."""
    eng = failing_loads[frontend]
    try:
        assert eng.proc.wait(timeout=60) == 1
    finally:
        eng.stop()
    log = eng.log_path.read_text(errors="replace")
    assert "engine failed to load" in log and "error: the model failed to load:" in log


def _children(pid: int) -> list[int]:
    path = f"/proc/{pid}/task/{pid}/children"
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_frontend_process_ends_with_the_engine_and_the_engine_with_it(tmp_path) -> None:
    """--frontend process: a TERM to the engine stops its HTTP child too (exit 0); a front end
    that dies under a running engine ends the engine with exit 1, so its manager sees it; an
    engine killed outright leaves no front end behind (it reads end-of-file and stops)."""
    eng = start_engine(tmp_path, extra_args=("--frontend", "process"))
    kids = _children(eng.proc.pid)
    assert kids and health_status(eng.url) == 200
    eng.stop()
    assert eng.proc.returncode == 0
    deadline = time.monotonic() + 10
    while not all(_gone(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(k) for k in kids)

    eng = start_engine(tmp_path, extra_args=("--frontend", "process"))
    try:
        front = [k for k in _children(eng.proc.pid) if "spawn_main" in _cmdline(k)]
        assert len(front) == 1
        os.kill(front[0], signal.SIGKILL)
        assert eng.proc.wait(timeout=30) == 1
        assert "the HTTP front end exited with -9" in eng.log_path.read_text(errors="replace")
    finally:
        eng.stop()

    eng = start_engine(tmp_path, extra_args=("--frontend", "process"))  # the engine killed
    kids = _children(eng.proc.pid)
    eng.proc.kill()
    eng.proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not all(_gone(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(k) for k in kids)  # no orphan front end left holding the port
    assert health_status(eng.url, timeout=1) is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_engine_imports_torch_ends_both_processes(tmp_path, sig) -> None:
    """The front end is spawned before the engine imports torch: a Ctrl-C or a TERM then (the
    front end up, the engine still loading) is a quiet stop with exit 0 that takes the front end
    with it; it was a KeyboardInterrupt traceback and a hang (the exit waited on the front end,
    which waited on the engine's pipe), and a TERM a death by signal (-15)."""
    eng = start_engine(tmp_path, extra_args=("--frontend", "process"), wait_healthy=False)
    try:
        deadline = time.monotonic() + 30
        front: list[int] = []
        while not front and time.monotonic() < deadline and eng.proc.poll() is None:
            with contextlib.suppress(OSError):
                front = [k for k in _children(eng.proc.pid) if "spawn_main" in _cmdline(k)]
            time.sleep(0.01)
        assert front, eng.log_tail()
        time.sleep(0.3)  # the engine is importing torch (over a second here)
        assert "engine pid" not in eng.log_path.read_text(errors="replace")  # still importing
        eng.proc.send_signal(sig)
        assert eng.proc.wait(timeout=20) == 0
    finally:
        eng.stop()
    deadline = time.monotonic() + 10
    while not _gone(front[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(front[0])
    assert "Traceback" not in eng.log_path.read_text(errors="replace")


def test_server_info_answers_at_once_while_the_engine_still_imports_torch(tmp_path) -> None:
    """Under the process front end, /get_server_info and /metrics answered only once the engine
    had imported torch (seconds on a GPU host): a monitor's poll hung that long. The engine is
    frozen (SIGSTOP) as soon as its front end is spawned, so it cannot finish the import; the
    front end then answers itself: not ready, starting, the engine's pid. Let go (SIGCONT), the
    engine serves and answers with its whole document."""
    eng = start_engine(tmp_path, extra_args=("--frontend", "process"), wait_healthy=False)
    try:
        deadline = time.monotonic() + 30
        front: list[int] = []
        while not front and time.monotonic() < deadline and eng.proc.poll() is None:
            with contextlib.suppress(OSError):
                front = [k for k in _children(eng.proc.pid) if "spawn_main" in _cmdline(k)]
            time.sleep(0.005)
        assert front, eng.log_tail()
        os.kill(eng.proc.pid, signal.SIGSTOP)  # still importing torch (over a second here)
        try:
            assert "engine pid" not in eng.log_path.read_text(errors="replace")
            status = None  # (one answer, read once: a second probe under a loaded CI timed out)
            while status is None and time.monotonic() < deadline:
                status = health_status(eng.url, timeout=5)  # the front end starts listening
                time.sleep(0.05)
            assert status == 503
            t0 = time.monotonic()
            info = httpx.get(f"{eng.url}/get_server_info", timeout=10)
            metrics = httpx.get(f"{eng.url}/metrics", timeout=10)
            assert time.monotonic() - t0 < 5  # at once, not after the engine's import
            assert info.status_code == 200 and metrics.status_code == 200
            doc = info.json()
            assert doc["ready"] is False and "importing" in doc["starting"], doc
            assert doc["pid"] == eng.proc.pid and doc["frontend"] == "process"
            assert "config" not in doc and metrics.text.startswith("#")
        finally:
            os.kill(eng.proc.pid, signal.SIGCONT)
        while health_status(eng.url, timeout=1) != 200 and time.monotonic() < deadline + 60:
            assert eng.proc.poll() is None, eng.log_tail()
            time.sleep(0.1)
        doc = httpx.get(f"{eng.url}/get_server_info", timeout=10).json()
        assert doc["ready"] is True and doc["pid"] == eng.proc.pid and "starting" not in doc
        assert doc["config"] and "ddtree" in httpx.get(f"{eng.url}/metrics", timeout=10).text
    finally:
        eng.stop()


def test_engine_side_of_the_pipe_survives_messages_it_cannot_use() -> None:
    """engine.engine_proc.serve_engine with a real tiny engine: an unknown kind, a submit with
    an unknown field and an unknown call are logged and skipped; the next call is answered and
    a closed pipe ends it with exit code 0."""
    import multiprocessing
    import threading

    from engine.engine_proc import serve_engine
    from engine.engine_state import EngineState

    ours, theirs = multiprocessing.Pipe(duplex=True)
    state = EngineState(EngineSpec(), "m")
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(serve_engine(state, theirs)), daemon=True)
    t.start()
    assert ours.poll(60) and ours.recv() == ("up", os.getpid())  # reading the pipe, loading
    assert ours.poll(60) and ours.recv()[0] == "ready"
    ours.send(("bogus",))
    ours.send(("submit", 1, {"prompt_ids": [1], "max_tokens": 1, "nope": 1}))
    ours.send(("call", 2, "nothing"))
    ours.send(("call", 3, "info"))
    assert ours.poll(30)
    kind, cid, doc = ours.recv()
    assert (kind, cid, doc["model"], doc["ready"]) == ("reply", 3, "m", True)
    ours.close()
    t.join(30)
    gc.unfreeze()  # loading froze this test process's objects: leave the collector as it was
    assert rc == [0]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_ctrl_c_stops_either_front_end_quietly(engine: EngineProcess) -> None:
    """SIGINT (a terminal's Ctrl-C) to a served engine, under either front end (process is the
    default): a graceful stop, exit 0, and no KeyboardInterrupt traceback (uvicorn raises the
    signal again after stopping). The engine is the module's, which has served every test
    above: this test stops it, so it is the file's last one (pytest runs a module's tests in
    file order, for each of the fixture's front ends in turn)."""
    assert engine.proc.poll() is None and health_status(engine.url) == 200
    served = len(engine.log_path.read_bytes())  # what the tests above left in its log
    engine.proc.send_signal(signal.SIGINT)
    assert engine.proc.wait(timeout=30) == 0
    with open(engine.log_path, "rb") as f:
        f.seek(served)
        assert "Traceback" not in f.read().decode(errors="replace")
