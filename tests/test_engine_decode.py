"""Reference engine, in process: AR == DDTree token identity (alone, batched, continuously
batched, per tree-build backend), tokenizer round trip, safetensors round trip."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch
from helpers.engine_waves import run_waves

from engine.backends import parse_backends
from engine.config import preset
from engine.golden import GOLDEN_PROMPTS
from engine.runtime import EngineSpec, build_decoder, generate
from engine.scheduler import GenRequest, Scheduler, Update
from engine.tokenizer import BOS_ID, EOS_ID, ByteTokenizer
from engine.weights import init_weights, load_weights, save_weights

MAX_TOKENS = 24
TOK = ByteTokenizer()


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    texts = list(GOLDEN_PROMPTS)
    alphabet = "abcdefghij klmnop,.;:!?ÄéΩж中文🙂\n\t"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(16)]
    ids = [TOK.encode(t) for t in texts]
    ids += [[rng.randrange(256) for _ in range(rng.randint(1, 30))] for _ in range(8)]  # no BOS
    return ids


PROMPTS = _prompts()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ar_outputs() -> list[list[int]]:
    _, dec = build_decoder(EngineSpec(mode="ar"))
    outs, accept = generate(dec, PROMPTS, MAX_TOKENS)
    assert set(accept) == {1}
    return outs


def test_prompt_set_is_large_and_outputs_nontrivial(ar_outputs: list[list[int]]) -> None:
    assert len(PROMPTS) >= 30
    assert all(len(o) > 0 for o in ar_outputs)
    assert len({tuple(o) for o in ar_outputs}) > len(PROMPTS) // 2  # not one constant output


def test_ar_alone_equals_ar_batched(ar_outputs: list[list[int]]) -> None:
    _, dec = build_decoder(EngineSpec(mode="ar"))
    for p, want in zip(PROMPTS[::4], ar_outputs[::4], strict=True):
        assert generate(dec, [p], MAX_TOKENS)[0][0] == want


@pytest.mark.parametrize("tree_build", ["reference", "cpp"])
def test_ddtree_equals_ar_batched_and_alone(ar_outputs: list[list[int]], tree_build: str) -> None:
    _, dec = build_decoder(EngineSpec(mode="ddtree", backends=(f"tree_build={tree_build}",)))
    assert dec.backends.names["tree_build"] == tree_build
    batched, accept = generate(dec, PROMPTS, MAX_TOKENS)
    assert batched == ar_outputs
    assert max(accept) > 1  # drafts were accepted: the trees were really exercised
    step = 1 if tree_build == "reference" else 3  # every prompt alone once is enough
    alone = [generate(dec, [p], MAX_TOKENS)[0][0] for p in PROMPTS[::step]]
    assert alone == ar_outputs[::step]


def test_ddtree_equals_ar_with_cpp_accept_and_small_budget(ar_outputs: list[list[int]]) -> None:
    spec = EngineSpec(mode="ddtree", backends=("accept=cpp", "tree_build=cpp"), budget=3)
    _, dec = build_decoder(spec)
    assert generate(dec, PROMPTS, MAX_TOKENS)[0] == ar_outputs


def test_budget_by_batch_fills_the_chunk_and_never_goes_below_the_budget() -> None:
    small = preset("small").engine  # budget 16, max_budget 32, chunk 576
    assert [small.budget_at(b) for b in (1, 8, 17, 18, 32)] == [32, 32, 32, 31, 17]
    assert all(b * (small.budget_at(b) + 1) <= small.row_chunk for b in range(1, 33))
    fixed = preset("small", max_budget=0).engine
    assert {fixed.budget_at(b) for b in range(1, 33)} == {16}
    tiny = preset("tiny", max_budget=15).engine  # budget 12, chunk 16: 15 alone, 12 batched
    assert [tiny.budget_at(b) for b in (1, 2, 8)] == [15, 12, 12]
    assert (tiny.largest_budget, tiny.k(258, 15), tiny.k(258)) == (15, 15, 12)


def test_ddtree_with_a_budget_by_batch_equals_ar_as_batches_grow_and_shrink(
    ar_outputs: list[list[int]],
) -> None:
    """Trees of 15 nodes at batch 1 and 12 when batched (one decoder, the sizes mixing as
    requests join and leave): every output still equals AR's, and the lone steps' trees were
    really larger (a step at batch 1 accepts from a 15-node tree)."""
    _, dec = build_decoder(EngineSpec(mode="ddtree", max_budget=15, max_batch_size=4))
    assert dec.cfg.budget_at(1) == 15 and dec.cfg.budget_at(2) == 12
    seen: list[int] = []
    build = dec.backends.tree_build
    dec.backends.tree_build = lambda lp, ids, budget: seen.append(budget) or build(lp, ids, budget)
    batched, accept = generate(dec, PROMPTS, MAX_TOKENS)
    assert batched == ar_outputs
    alone = [generate(dec, [p], MAX_TOKENS)[0][0] for p in PROMPTS[::5]]
    assert alone == ar_outputs[::5]
    assert {12, 15} <= set(seen) and max(accept) > 1
    assert dec.cache.free_pages == dec.cache.num_pages


def test_project_golden_prompts_identity_and_accept_length_above_two() -> None:
    """checks/data/golden_prompts.json: DDTree == AR, and > 2 tokens per step on average."""
    from engine.golden import PROJECT_PROMPTS, load_prompts

    assert PROJECT_PROMPTS.is_file()
    prompts = [TOK.encode(t) for t in load_prompts()]
    _, ar = build_decoder(EngineSpec(mode="ar"))
    _, dd = build_decoder(EngineSpec(mode="ddtree"))
    want, _ = generate(ar, prompts, 32)
    got, accept = generate(dd, prompts, 32)
    assert got == want
    assert sum(accept) / len(accept) > 2.0
    assert dd.cache.free_pages == dd.cache.num_pages


def test_continuous_batching_matches_ar(ar_outputs: list[list[int]]) -> None:
    """10 requests through a 3-wide scheduler: they join and leave between steps."""
    _, dec = build_decoder(EngineSpec(mode="ddtree", max_batch_size=3))
    sched = Scheduler(dec)
    results: dict[int, list[int]] = {}
    reasons: dict[int, str | None] = {}
    done = threading.Event()
    lengths = [MAX_TOKENS - 3 * (i % 4) for i in range(10)]

    def sink(i: int):
        def put(u: Update) -> None:
            results.setdefault(i, []).extend(u.token_ids)
            if u.finished:
                reasons[i] = u.finish_reason
                if len(reasons) == 10:
                    done.set()

        return put

    sched.start()
    try:
        for i in range(10):
            sched.submit(GenRequest(PROMPTS[i], lengths[i], sink(i)))
        assert done.wait(120)
    finally:
        sched.shutdown()
    for i in range(10):
        want = ar_outputs[i][: lengths[i]]
        assert results.get(i, []) == want
        assert reasons[i] == ("length" if len(want) == lengths[i] else "stop")
    sizes = set(sched.stats.steps_by_batch)
    assert 3 in sizes and min(sizes) < 3 and max(sizes) == 3
    assert dec.cache.free_pages == dec.cache.num_pages  # every page came back


def test_scheduler_hands_out_one_batch_of_updates_per_step(ar_outputs: list[list[int]]) -> None:
    """Scheduler.dispatch gets each iteration's updates together (the server turns one batch
    into one event-loop wake-up): a full 4-wide step is one call with 4 updates, never one call
    per request; `deliver` calls every sink, a broken one (a client gone) not stopping the
    others; outputs still equal AR's."""
    from engine.scheduler import deliver

    _, dec = build_decoder(EngineSpec(mode="ddtree", max_batch_size=4))
    batches: list[int] = []
    got: dict[int, list[int]] = {}
    finished: set[int] = set()
    done = threading.Event()

    def dispatch(batch) -> None:
        batches.append(len(batch))
        deliver(batch)

    def sink(i: int):
        def put(u: Update) -> None:
            got.setdefault(i, []).extend(u.token_ids)
            if u.finished:
                finished.add(i)
                if len(finished) == 3:
                    done.set()

        return put

    def broken(u: Update) -> None:
        raise RuntimeError("client gone")

    sched = Scheduler(dec, dispatch=dispatch)
    sched.submit(GenRequest(PROMPTS[3], MAX_TOKENS, broken, group="gone"))
    for i in range(3):  # queued before the thread starts: admitted together, stepped together
        sched.submit(GenRequest(PROMPTS[i], MAX_TOKENS, sink(i)))
    sched.start()
    try:
        assert done.wait(120)
    finally:
        sched.shutdown()
    assert [got[i] for i in range(3)] == [ar_outputs[i][:MAX_TOKENS] for i in range(3)]
    steps = sum(sched.stats.steps_by_batch.values())
    assert batches[0] == 4  # the first step's four updates (the broken sink's among them)
    assert len(batches) <= steps + 1  # one call per iteration, not one per request
    assert sum(batches) >= 3 * len(batches) - 3


def test_ddtree_batches_up_to_64_with_joining_requests_equal_ar_alone() -> None:
    """Batches of 1, 7, 32 and 64 (max batch 64), ragged prompts, requests joining mid-run:
    every DDTree output equals the same prompt's AR output decoded alone."""
    prompts = [PROMPTS[i % len(PROMPTS)] + [i % 250] * (i % 5) for i in range(64)]
    _, ar = build_decoder(EngineSpec(mode="ar", max_batch_size=1))
    alone = [generate(ar, [p], 12, stop_at_eos=False)[0][0] for p in prompts]
    _, dd = build_decoder(EngineSpec(mode="ddtree", max_batch_size=64))
    for waves in ([1], [7], [4, 28], [16, 16, 32]):
        n = sum(waves)
        outs, sizes = run_waves(dd, prompts[:n], 12, waves)
        assert outs == alone[:n], waves
        assert max(sizes) >= waves[-1] and (len(waves) == 1 or len(sizes) > 1)
    assert dd.cache.free_pages == dd.cache.num_pages


def test_a_broken_request_fails_alone(ar_outputs: list[list[int]]) -> None:
    """Requests that bypass the server's validation (bad ids, empty prompt) fail by
    themselves; the one decoding beside them is unaffected and the loop keeps serving."""
    _, dec = build_decoder(EngineSpec(mode="ddtree"))
    sched = Scheduler(dec)
    got: dict[str, list[Update]] = {}
    done = threading.Event()

    def sink(name: str):
        def put(u: Update) -> None:
            got.setdefault(name, []).append(u)
            if sum(1 for v in got.values() if v[-1].finished) == 3:
                done.set()

        return put

    sched.start()
    try:
        sched.submit(GenRequest(PROMPTS[0], MAX_TOKENS, sink("good")))
        sched.submit(GenRequest([5, 10**6], 4, sink("bad ids")))
        sched.submit(GenRequest([], 4, sink("empty")))
        assert done.wait(60)
        assert sched.alive
    finally:
        sched.shutdown()
    assert got["bad ids"][-1].finish_reason == "error"
    assert got["empty"][-1].finish_reason == "error"
    assert [t for u in got["good"] for t in u.token_ids] == ar_outputs[0]


def test_scheduler_stops_at_stop_string_and_eos() -> None:
    req = GenRequest([BOS_ID], 10, lambda u: None, stop=("bc",))
    assert req.take([ord("a"), ord("b")]).finished is False
    u = req.take([ord("c"), ord("d")])
    assert u.finished and u.finish_reason == "stop" and u.token_ids == [ord("c")]
    req = GenRequest([BOS_ID], 10, lambda u: None)
    u = req.take([1, 2, EOS_ID, 3])
    assert u.finished and u.finish_reason == "stop" and u.token_ids == [1, 2]
    req = GenRequest([BOS_ID], 3, lambda u: None)
    u = req.take([1, 2, 3, 4])
    assert u.finish_reason == "length" and u.token_ids == [1, 2, 3]


@pytest.mark.parametrize(
    "text", ["", "hello", "héllo wörld", "中文字符", "emoji 🙂👍🏽", "\x00\n\t\x7f", "ǅ\U0010ffff"]
)
def test_tokenizer_round_trip(text: str) -> None:
    ids = TOK.encode(text)
    assert ids[0] == BOS_ID and all(0 <= i < 256 for i in ids[1:])
    assert TOK.decode(ids) == text
    assert TOK.decode(TOK.encode(text, add_bos=False) + [EOS_ID]) == text


def test_tokenizer_round_trip_random_unicode() -> None:
    rng = random.Random(0)
    for _ in range(200):
        cps = [rng.randrange(0x110000) for _ in range(rng.randint(0, 20))]
        text = "".join(chr(c) for c in cps if not 0xD800 <= c < 0xE000)
        assert TOK.decode(TOK.encode(text)) == text


def test_stream_decoder_holds_back_incomplete_utf8() -> None:
    dec = TOK.stream_decoder()
    raw = list("é🙂".encode())
    parts = [dec.feed([b]) for b in raw]
    assert "".join(parts) + dec.flush() == "é🙂"
    assert parts[0] == "" and parts[1] == "é"


def test_safetensors_round_trip(tmp_path, ar_outputs: list[list[int]]) -> None:
    cfg = preset("tiny").model
    path = tmp_path / "tiny.safetensors"
    save_weights(path, cfg, init_weights(cfg, seed=0))
    cfg2, w2 = load_weights(path)
    assert cfg2 == cfg
    ref = init_weights(cfg, seed=0)
    assert set(w2) == set(ref) and all(torch.equal(w2[k], ref[k]) for k in ref)
    _, dec = build_decoder(EngineSpec(mode="ddtree", weights=str(path)))
    assert generate(dec, PROMPTS[:8], MAX_TOKENS)[0] == ar_outputs[:8]
    # a different seed gives a different model; a file with a tensor missing is refused
    assert not torch.equal(init_weights(cfg, seed=1)["embed"], ref["embed"])
    del ref["head"]
    save_weights(tmp_path / "bad.safetensors", cfg, ref)
    with pytest.raises(ValueError, match="tensor names differ"):
        load_weights(tmp_path / "bad.safetensors")


def test_backend_specs_are_validated() -> None:
    assert parse_backends(["tree_build=cpp"], "cpu")["tree_build"] == "cpp"
    with pytest.raises(ValueError, match="bad --backend"):
        parse_backends(["tree_build=gpu"], "cpu")
    with pytest.raises(ValueError, match="bad --backend"):
        parse_backends(["sampler=reference"], "cpu")
    with pytest.raises(ValueError, match="needs --device cuda"):
        parse_backends(["attention=cuda"], "cpu")


def test_rowwise_plan_matches_the_attention_reference() -> None:
    """The layout handed to the CUDA attention (each row its own T = 1 request over a
    page_size-1 view) gives, through the float64 tree-verify reference, exactly the row-by-row
    attention over the visible keys; the batched torch path agrees to fp32 rounding."""
    from engine.attention import TorchAttention, reference_attention, rowwise_plan
    from kernels.reference_attention import tree_verify_attention

    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(64, 576, generator=gen, dtype=torch.float64)
    lens = np.array([1, 5, 17, 9, 33, 70])
    table = np.zeros((len(lens), 70), dtype=np.int64)
    for i, n in enumerate(lens):
        table[i, :n] = torch.randint(0, 64, (n,), generator=gen).numpy()
    q = torch.randn(len(lens), 3, 576, generator=gen, dtype=torch.float64)
    scale = 576**-0.5
    plan = rowwise_plan(table, lens, torch.device("cpu"))
    assert plan.max_kv_len == 70 and plan.prefix_lens.tolist() == (lens - 1).tolist()
    kv = pool.view(64, 1, 576)
    got = tree_verify_attention(
        q, kv, plan.block_table, plan.prefix_lens, plan.tree_lens, plan.visibility, scale
    )
    want = reference_attention(q, pool, table, lens, scale, 512)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-12, atol=1e-12)
    att = TorchAttention(bucket=16, rows_per_call=4)
    batched = att(q.float(), pool.float(), att.plan(table, lens, q.device), scale, 512)
    torch.testing.assert_close(batched.double(), want, rtol=1e-5, atol=1e-5)


def test_torch_attention_row_results_do_not_depend_on_the_batch() -> None:
    """A row's output is bit-identical alone, at any position of a batch, beside any rows."""
    from engine.attention import TorchAttention

    gen = torch.Generator().manual_seed(1)
    pool = torch.randn(300, 40, generator=gen)
    att = TorchAttention(bucket=16, rows_per_call=4)
    rng = np.random.default_rng(2)
    lens = rng.integers(1, 120, size=23)
    table = rng.integers(0, 300, size=(23, 120))
    q = torch.randn(23, 4, 40, generator=gen)
    full = att(q, pool, att.plan(table, lens, q.device), 0.1, 32)
    for trial in range(6):
        pick = rng.permutation(23)[: rng.integers(1, 23)]
        part = att(q[pick], pool, att.plan(table[pick], lens[pick], q.device), 0.1, 32)
        assert torch.equal(part, full[pick]), trial


def test_forward_rows_are_batch_invariant() -> None:
    """The chunked forward: every row's logits are bit-identical whatever rows share its chunk,
    its position in the chunk, and the number of chunks (1 to 64 rows)."""
    from engine.forward import AttentionTimer, Rows

    _, dec = build_decoder(EngineSpec(mode="ar", max_batch_size=64))
    rng = np.random.default_rng(3)
    n = 64
    # each row writes its own slot (its last visible one); the rest of what it sees is
    # written by nobody in the forward, so rows interact only through the batch itself
    slots = rng.integers(n, dec.cache.trash_slot, size=(n, 40))
    lens = rng.integers(1, 41, size=n)
    write = rng.permutation(n)
    slots[np.arange(n), lens - 1] = write
    rows = Rows(rng.integers(0, 258, size=n), lens - 1, write, slots, lens)
    pool = dec.cache.pool
    pool.normal_(generator=torch.Generator().manual_seed(4))
    snapshot = pool.clone()

    def run(idx: np.ndarray) -> torch.Tensor:
        pool.copy_(snapshot)
        sub = Rows(
            *(
                getattr(rows, f)[idx]
                for f in ("tokens", "positions", "write_slots", "table", "lens")
            )
        )
        return dec.forward.run(sub, dec.backends.attention, AttentionTimer(pool.device)).clone()

    everything = run(np.arange(n))
    for size in (1, 7, 16, 17, 33, 64):
        idx = rng.permutation(n)[:size]
        assert torch.equal(run(idx), everything[idx]), size


def test_sampling_is_ar_only() -> None:
    _, dd = build_decoder(EngineSpec(mode="ddtree"))
    with pytest.raises(ValueError, match="ar mode only"):
        dd.new_sequence([BOS_ID], temperature=1.0)


CUDA_REFUSERS = ("engine.golden", "engine.bench")


@pytest.fixture(scope="module")
def cuda_refusals(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`python -m MODULE --device cuda` for each of CUDA_REFUSERS, run together (each imports
    torch, ~3 s of one core, before it finds no GPU): module -> the finished process."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("cuda-refusals")

    def run(module: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", module, "--device", "cuda"]
        argv += ["--json", str(tmp / "x.json")] if module == "engine.bench" else []
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(len(CUDA_REFUSERS)) as pool:
        return dict(zip(CUDA_REFUSERS, pool.map(run, CUDA_REFUSERS), strict=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
@pytest.mark.parametrize("module", CUDA_REFUSERS)
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(module: str, cuda_refusals) -> None:
    p = cuda_refusals[module]
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: --device cuda: CUDA is not available") and (
        p.stderr.count("\n") == 1
    ), p.stderr


def test_engine_bench_on_the_cpu_runs_the_cpu_set_and_checks_identity_under_load(tmp_path) -> None:
    import json

    from engine.bench import main

    out = tmp_path / "bench.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--concurrency", "1", "3"]
    assert main([*argv, "--max-tokens", "6", "--identity-tokens", "6", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc["sets"]) == ["cpu-kernels"] and doc["skipped_sets"] == {
        "cuda": "needs --device cuda"
    }
    entry = doc["sets"]["cpu-kernels"]
    assert entry["backends"][1] == "tree_build=cpp"
    assert entry["ddtree_equals_ar"] and entry["load_identity"] == {"1": True, "3": True}
    assert {(r["mode"], r["concurrency"]) for r in entry["load"]} == {
        (m, c) for m in ("ar", "ddtree") for c in (1, 3)
    }


def test_engine_bench_rounds_keep_c_in_flight_and_measure_the_steady_window(tmp_path) -> None:
    """--rounds 3 at c = 3: 9 requests, never more than 3 in flight, each finished one replaced
    (most steps at batch 3, where a batch job of 3 would drain to 2 and 1 at once); the steady
    tokens/s covers the window until the last submission; identity still holds per request."""
    import json

    from engine.bench import main

    out = tmp_path / "bench.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--concurrency", "3", "--rounds", "3"]
    assert main([*argv, "--max-tokens", "8", "--identity-tokens", "4", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    entry = doc["sets"]["cpu-kernels"]
    assert doc["rounds"] == 3 and entry["load_identity"] == {"3": True}
    for r in entry["load"]:
        assert r["requests"] == 9 and r["tokens"] == 9 * 8 and r["completed"]
        batches = {int(b): n for b, n in r["steps_by_batch"].items()}
        assert max(batches) == 3 and batches[3] > sum(n for b, n in batches.items() if b < 3)
        assert 0 < r["steady_window_s"] < r["wall_s"] and r["steady_tokens_per_s"] > 0
        assert r["steady_tokens_per_s"] in r["steady_tokens_per_s_runs"]
    one = tmp_path / "one.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--concurrency", "2", "--max-tokens", "4"]
    assert main([*argv, "--identity-tokens", "4", "--json", str(one)]) == 0
    level = json.loads(one.read_text())["sets"]["cpu-kernels"]["load"][0]
    assert level["requests"] == 2 and level["steady_tokens_per_s"] is None
    assert main([*argv, "--rounds", "0", "--json", str(one)]) == 2
