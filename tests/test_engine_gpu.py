"""Reference engine on a CUDA GPU: the `small` preset with every DDTree component on CUDA keeps
DDTree output token-identical to AR output, batched and alone."""

from __future__ import annotations

import pytest

from engine.golden import GOLDEN_PROMPTS
from engine.runtime import EngineSpec, build_decoder, generate
from engine.tokenizer import ByteTokenizer

CUDA = ("topk=cuda", "tree_build=cuda", "accept=cuda", "attention=cuda")


@pytest.mark.gpu
def test_small_preset_cuda_backends_ddtree_equals_ar() -> None:
    tok = ByteTokenizer()
    prompts = [tok.encode(t) for t in GOLDEN_PROMPTS[:8]]
    _, ar = build_decoder(EngineSpec("small", "ar", "cuda", CUDA))
    _, dd = build_decoder(EngineSpec("small", "ddtree", "cuda", CUDA))
    want, _ = generate(ar, prompts, 24)
    got, accept = generate(dd, prompts, 24)
    assert got == want
    assert max(accept) > 1
    assert [generate(dd, [p], 24)[0][0] for p in prompts[:3]] == want[:3]
