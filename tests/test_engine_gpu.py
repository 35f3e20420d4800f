"""Reference engine on a CUDA GPU (preset `small`): DDTree output == AR output, token for token,
with every component on CUDA and with the CPU components, CUDA graphs on and off, alone and in
batches of 1, 7, 32 and 64 with requests joining mid-run."""

from __future__ import annotations

import pytest
from helpers.engine_waves import run_waves

from engine.golden import GOLDEN_PROMPTS
from engine.runtime import EngineSpec, build_decoder, generate
from engine.tokenizer import ByteTokenizer

SETS = {
    "cuda": ("topk=cuda", "tree_build=cuda", "accept=cuda", "attention=cuda"),
    "cpu-kernels": ("topk=reference", "tree_build=cpp", "accept=reference", "attention=torch"),
}
TOK = ByteTokenizer()


def _prompts(n: int) -> list[list[int]]:
    base = [TOK.encode(t) for t in GOLDEN_PROMPTS]
    return [base[i % len(base)] + [97 + i % 26] * (i % 7) for i in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("backends", list(SETS))
def test_small_preset_ddtree_equals_ar(backends: str, graphs: bool) -> None:
    spec = dict(preset="small", device="cuda", backends=SETS[backends], cuda_graphs=graphs)
    prompts = _prompts(12)
    _, ar = build_decoder(EngineSpec(mode="ar", **spec))
    _, dd = build_decoder(EngineSpec(mode="ddtree", **spec))
    want, _ = generate(ar, prompts, 24)
    got, accept = generate(dd, prompts, 24)
    assert got == want
    assert max(accept) > 1
    assert [generate(dd, [p], 24)[0][0] for p in prompts[:3]] == want[:3]


@pytest.mark.gpu
@pytest.mark.parametrize("backends", list(SETS))
def test_batches_1_7_32_64_with_joining_requests_equal_ar_alone(backends: str) -> None:
    spec = dict(preset="small", device="cuda", backends=SETS[backends])
    prompts = _prompts(64)
    _, ar = build_decoder(EngineSpec(mode="ar", max_batch_size=1, **spec))
    alone = [generate(ar, [p], 16, stop_at_eos=False)[0][0] for p in prompts]
    _, dd = build_decoder(EngineSpec(mode="ddtree", max_batch_size=64, **spec))
    for waves in ([1], [7], [8, 24], [16, 16, 32]):
        n = sum(waves)
        outs, sizes = run_waves(dd, prompts[:n], 16, waves)
        assert outs == alone[:n], waves
        assert max(sizes) >= waves[-1]
    _, ar64 = build_decoder(EngineSpec(mode="ar", max_batch_size=64, **spec))
    outs, _ = run_waves(ar64, prompts, 16, [32, 32])
    assert outs == alone
    assert dd.forward.captured_graphs > 0


@pytest.mark.gpu
def test_graphs_and_eager_agree() -> None:
    """Replaying the captured segments computes what running them eagerly computes."""
    spec = dict(preset="small", device="cuda", backends=SETS["cuda"], mode="ddtree")
    prompts = _prompts(8)
    _, g = build_decoder(EngineSpec(cuda_graphs=True, **spec))
    _, e = build_decoder(EngineSpec(cuda_graphs=False, **spec))
    assert generate(g, prompts, 16)[0] == generate(e, prompts, 16)[0]
