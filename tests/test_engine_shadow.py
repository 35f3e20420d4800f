"""The engine's shadow (engine.shadow): a candidate attention timed beside the serving one on the
service's own forwards, in process and through a served engine's POST /shadow. On a CPU the
candidate is a second torch backend (the A/A shadow); the GPU's cuda candidate runs in the
rollout (benchmarks/results) and in tests/test_engine_gpu.py."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import torch
from helpers.engine_server import start_engine

from engine.golden import GOLDEN_PROMPTS
from engine.runtime import EngineSpec, build_decoder, generate
from engine.shadow import MAX_FORWARDS, PAIR_FIELDS, Pair, Shadow
from engine.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
PROMPTS = [TOK.encode(t) for t in GOLDEN_PROMPTS[:6]]
SERVING = {"attention": "torch", "tree_build": "reference", "accept": "reference"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def decoder():
    _, dec = build_decoder(EngineSpec(mode="ddtree"))
    return dec


def _pairs(doc: dict) -> list[dict]:
    assert doc["pair_fields"] == PAIR_FIELDS
    return [dict(zip(PAIR_FIELDS, p, strict=True)) for p in doc["pairs"]]


def test_a_shadowed_forward_changes_no_output_and_pairs_every_sampled_forward(decoder) -> None:
    """The same prompts without and with the A/A shadow: the same tokens; the shadow sampled as
    many forwards as it was armed for, steps and prefills, first alternating, both backends
    timed (> 0) in each; then it is off by itself."""
    plain, _ = generate(decoder, PROMPTS, 12)
    doc = decoder.shadow.arm({"attention": "torch", "forwards": 9})
    assert (doc["candidate"], doc["left"], doc["pairs"]) == ("torch", 9, [])
    shadowed, _ = generate(decoder, PROMPTS, 12)
    assert shadowed == plain
    doc = decoder.shadow.doc()
    pairs = _pairs(doc)
    assert (doc["left"], doc["sampled"], len(pairs), doc["error"]) == (0, 9, 9, None)
    assert {p["kind"] for p in pairs} == {"prefill", "step"}
    seen: dict = {}  # the order alternates per (kind, rows)
    for p in pairs:
        n = seen.get((p["kind"], p["rows"]), 0)
        seen[(p["kind"], p["rows"])] = n + 1
        assert p["first"] == ("base" if n % 2 == 0 else "cand"), pairs
    assert any(n > 1 for n in seen.values())
    for p in pairs:
        assert p["rows"] > 0
        assert min(p["base_plan_us"], p["base_calls_us"], p["cand_calls_us"]) > 0, p
    again, _ = generate(decoder, PROMPTS[:1], 4)  # off: no more pairs
    assert len(decoder.shadow.doc()["pairs"]) == 9


@pytest.mark.parametrize("candidate", ["reference", "cpp"])
def test_a_shadowed_tree_build_changes_no_output_and_pairs_every_sampled_step(
    decoder, candidate: str
) -> None:
    """The tree build's shadow: the A/A reference and the compiled C++ builder beside the
    serving reference, on the same steps: the same tokens; one pair per step, rows = the
    batch, the order alternating per batch size; both timed."""
    plain, _ = generate(decoder, PROMPTS, 12)
    doc = decoder.shadow.arm({"tree_build": candidate, "forwards": 500})
    assert (doc["component"], doc["baseline"], doc["candidate"]) == (
        "tree_build",
        "reference",
        candidate,
    )
    shadowed, _ = generate(decoder, PROMPTS, 12)
    decoder.shadow.arm({"forwards": 0})
    assert shadowed == plain
    doc = decoder.shadow.doc()
    pairs = _pairs(doc)
    assert doc["error"] is None and len(pairs) == doc["sampled"] > 3
    assert {p["kind"] for p in pairs} == {"step"}
    assert {p["rows"] for p in pairs} <= set(range(1, len(PROMPTS) + 1))
    assert {p["first"] for p in pairs} == {"base", "cand"}
    assert all(p["base_calls_us"] > 0 and p["cand_calls_us"] > 0 for p in pairs)


class _Broken:
    name = "broken"

    def plan(self, table, lens, device):
        return None

    def __call__(self, q, pool, plan, scale, latent_dim):
        raise RuntimeError("candidate fault")


@pytest.mark.parametrize("component", ["attention", "tree_build"])
def test_a_candidate_that_raises_is_disarmed_and_the_service_goes_on(decoder, component) -> None:
    plain, _ = generate(decoder, PROMPTS[:3], 8)
    real = decoder.shadow

    def broken_build(lp, ids, budget):
        raise RuntimeError("candidate fault")

    make = {"attention": lambda c, k: _Broken(), "tree_build": lambda c, k: broken_build}
    decoder.shadow = decoder.forward.shadow = Shadow(SERVING, make[component], "cpu")
    try:
        kind = "torch" if component == "attention" else "reference"
        decoder.shadow.arm({component: kind, "forwards": 50})
        out, _ = generate(decoder, PROMPTS[:3], 8)
        doc = decoder.shadow.doc()
    finally:
        decoder.shadow = decoder.forward.shadow = real
    assert out == plain
    assert (doc["left"], doc["pairs"], doc["sampled"]) == (0, [], 1)
    assert doc["error"] == "RuntimeError: candidate fault"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "JSON object"),
        ({"accept": "cuda", "forwards": 4}, "unknown field 'accept'"),
        ({"attention": "torch", "tree_build": "cpp", "forwards": 4}, "name one component"),
        ({"forwards": 4}, "name one component"),
        ({"tree_build": "torch", "forwards": 4}, "one of reference, cpp, cuda"),
        ({"tree_build": "cuda", "forwards": 4}, "a cuda tree_build shadow needs the engine on"),
        ({"attention": "torch"}, "'forwards' must be an integer"),
        ({"attention": "torch", "forwards": -1}, "'forwards' must be an integer"),
        ({"attention": "torch", "forwards": MAX_FORWARDS + 1}, "'forwards' must be an integer"),
        ({"attention": "torch", "forwards": True}, "'forwards' must be an integer"),
        ({"attention": "triton", "forwards": 4}, "one of torch, cuda"),
        ({"attention": "x" * 100_000, "forwards": 4}, r"got 'xxxxxxxxx+\.\.\.$"),
        ({"forwards": 10**50}, r"got <167-bit int>$"),
        ({"attention": "cuda", "forwards": 4}, "needs the engine on a GPU"),
    ],
)
def test_bad_arms_are_refused_and_leave_the_shadow_as_it_was(body, says) -> None:
    shadow = Shadow(SERVING, lambda c, k: object(), "cpu")
    before = shadow.doc()
    with pytest.raises(ValueError, match=says):
        shadow.arm(body)
    assert shadow.doc() == before


def test_a_backend_that_cannot_start_is_refused_with_its_reason() -> None:
    def make(component, kind):
        raise OSError("libddtree_kernels.so: not found")

    shadow = Shadow(SERVING, make, "cuda")
    with pytest.raises(
        ValueError, match="cuda attention backend cannot start here: libddtree_kern"
    ):
        shadow.arm({"attention": "cuda", "forwards": 4})


def test_served_engine_arms_times_and_refuses_over_http(tmp_path) -> None:
    """POST /shadow on a real served engine (its own front-end process): a bad body is a 400
    with the reason and changes nothing; an A/A arm, then requests: the pairs are in
    /get_server_info; forwards 0 disarms and keeps them; the service answers throughout."""
    eng = start_engine(tmp_path, extra_args=("--max-batch-size", "4"))
    try:
        url = eng.url

        def post(body, raw: bytes | None = None) -> httpx.Response:
            content = raw if raw is not None else json.dumps(body).encode()
            return httpx.post(
                f"{url}/shadow",
                content=content,
                timeout=30,
                headers={"content-type": "application/json"},
            )

        def info() -> dict:
            return httpx.get(f"{url}/get_server_info", timeout=30).json()["shadow"]

        for body, raw, says in [
            (None, b"{nope", "invalid JSON body"),
            ({"attention": "cuda", "forwards": 5}, None, "needs the engine on a GPU"),
            ({"attention": "torch", "forwards": "5"}, None, "'forwards' must be an integer"),
        ]:
            r = post(body, raw)
            assert r.status_code == 400, r.text
            assert says in r.json()["error"]["message"]
        assert info()["candidate"] is None and info()["armed_forwards"] == 0

        r = post({"attention": "torch", "forwards": 200})
        assert r.status_code == 200 and r.json()["left"] == 200
        for prompt in GOLDEN_PROMPTS[:3]:
            c = httpx.post(
                f"{url}/v1/completions",
                timeout=60,
                json={"prompt": prompt, "max_tokens": 6, "temperature": 0},
            )
            assert c.status_code == 200, c.text
        doc = info()
        pairs = _pairs(doc)
        assert doc["sampled"] == len(pairs) > 3 and doc["left"] == 200 - len(pairs)
        assert {p["kind"] for p in pairs} == {"prefill", "step"}
        r = post({"forwards": 0})
        assert r.status_code == 200 and r.json()["left"] == 0
        assert len(r.json()["pairs"]) == len(pairs)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        eng.stop()


def test_a_pair_or_error_from_an_earlier_window_is_dropped() -> None:
    """A call taken before a re-arm that finishes after it: its pair and its error belong to
    the old window, and the new one keeps neither (the race a probe found: attention pairs in
    a tree_build window, more pairs than sampled)."""
    shadow = Shadow(SERVING, lambda c, k: object(), "cpu")
    shadow.arm({"attention": "torch", "forwards": 5})
    old = shadow.take("attention", "step", 4)
    assert old is not None and shadow.take("tree_build", "step", 4) is None  # not armed for it
    shadow.arm({"tree_build": "cpp", "forwards": 5})
    shadow.record(Pair("prefill", 16, 1, 2, 3, 4, "base"), old.window)
    shadow.fail(RuntimeError("late"), old.window)
    doc = shadow.doc()
    assert (doc["component"], doc["pairs"], doc["error"], doc["left"]) == (
        "tree_build",
        [],
        None,
        5,
    )
    new = shadow.take("tree_build", "step", 4)
    shadow.record(Pair("step", 4, 0, 5, 0, 2, new.first), new.window)
    assert len(shadow.doc()["pairs"]) == shadow.doc()["sampled"] == 1


def test_an_ar_engine_refuses_a_tree_build_shadow() -> None:
    _, ar = build_decoder(EngineSpec(mode="ar"))
    with pytest.raises(ValueError, match=r"this engine \(--mode ar\) builds no trees"):
        ar.shadow.arm({"tree_build": "cpp", "forwards": 5})


def test_the_stage_clock_takes_a_shadows_time_out_of_its_stage() -> None:
    from engine.stage_clock import StageClock

    clock = StageClock(None)
    time.sleep(0.02)
    clock.lap("tree_build")
    clock.lap("verify")
    clock.exclude("tree_build", 0.015)
    clock.exclude("nothing", 1.0)  # a stage the step did not lap: ignored
    m = clock.marks
    assert clock.finish() == {"tree_build": m[1] - m[0] - 0.015, "verify": m[2] - m[1]}
    clock = StageClock(None)
    clock.lap("tree_build")
    clock.exclude("tree_build", 5.0)
    assert clock.finish() == {"tree_build": 0.0}


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("component", "candidate"),
    [("attention", "cuda"), ("attention", "torch"), ("tree_build", "cuda")],
)
def test_gpu_shadow_changes_no_output_and_times_both_kinds(component: str, candidate: str) -> None:
    """On a GPU (preset small, torch attention and the reference tree build serving): the cuda
    attention kernel, the A/A torch attention and the CUDA tree-build stage as the shadow; the
    outputs of a batch of 8 with and without it are the same tokens, every sampled call is
    paired, both orders present. s itself is the rollout's to report (benchmarks/results), not
    a timed assertion here; the test prints the profile's summary of the pairs (-s)."""
    _, dec = build_decoder(EngineSpec(mode="ddtree", preset="small", device="cuda"))
    prompts = [TOK.encode(t) * 8 for t in GOLDEN_PROMPTS[:8]]
    plain, _ = generate(dec, prompts, 24)
    dec.shadow.arm({component: candidate, "forwards": 2000})
    shadowed, _ = generate(dec, prompts, 24)
    doc = dec.shadow.doc()
    assert shadowed == plain
    pairs = _pairs(doc)
    assert doc["error"] is None and len(pairs) == doc["sampled"] > 8
    kinds = {"prefill", "step"} if component == "attention" else {"step"}
    assert {p["kind"] for p in pairs} == kinds
    assert {p["first"] for p in pairs} == {"base", "cand"}
    assert all(p["base_calls_us"] > 0 and p["cand_calls_us"] > 0 for p in pairs)
    from ops.measure.shadow import summarize

    sm = summarize(doc)
    for kind in sorted(kinds):
        k = sm[kind]
        orders = ", ".join(
            f"{o} first {k[f's_{o}_first']:.3f}"
            for o in ("base", "cand")
            if k[f"s_{o}_first"] is not None
        )
        print(
            f"shadow {component}={candidate} {kind}: s {k['s']:.3f} ({k['lo']:.3f}.."
            f"{k['hi']:.3f}), {orders}, {k['forwards']} calls, rows {k['rows_mean']:.0f}"
        )
