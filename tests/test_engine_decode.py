"""Reference engine, in process: AR == DDTree token identity (alone, batched, continuously
batched, per tree-build backend), tokenizer round trip, safetensors round trip."""

from __future__ import annotations

import random
import threading

import pytest
import torch

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


def test_rowwise_request_layout_matches_torch_attention() -> None:
    """The layout handed to the CUDA attention (each row its own T = 1 request over a
    page_size-1 view) gives, through the float64 Kernels II reference, the torch path's result."""
    from engine.backends import rowwise_requests
    from engine.model import torch_attention
    from kernels.reference_attention import tree_verify_attention

    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(64, 576, generator=gen, dtype=torch.float64)
    lens = [1, 5, 17, 9, 33]
    rows = [torch.randperm(64, generator=gen)[:n] for n in lens]
    table = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    q = torch.randn(len(lens), 3, 576, generator=gen, dtype=torch.float64)
    scale = 576**-0.5
    kv, bt, pl, tl, vis, max_kv = rowwise_requests(pool, table, lens)
    assert max_kv == 33 and pl.tolist() == [n - 1 for n in lens] and tl.tolist() == [1] * 5
    got = tree_verify_attention(q, kv, bt, pl, tl, vis, scale)
    want = torch_attention(q, pool, table, lens, scale, 512)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-12, atol=1e-12)


def test_sampling_is_ar_only() -> None:
    _, dd = build_decoder(EngineSpec(mode="ddtree"))
    with pytest.raises(ValueError, match="ar mode only"):
        dd.new_sequence([BOS_ID], temperature=1.0)
