"""The GPU accept drop-in (integration.gpu_accept): the fork's contract, its oracle, the
fallback to the stock function, and (gpu-marked) the CUDA kernel and the Triton baseline held
bit for bit to the oracle on thousands of random rows, ties across siblings included.

The oracle (`reference`, plain torch, early exit) is itself held to `fork_loop_walk` below: a
plain-Python model of the fork's kernel's control flow as read from the fork (SyJarvis/sglang
at 4b08d3cc, triton_ops/ddtree.py): a fixed outer loop of next_pow2(S) - 1 steps, each scanning
at most next_pow2(S) children with masks, links truncated to int32, no early exit.
"""

from __future__ import annotations

import inspect
import random

import pytest
import torch
from helpers.triton_accept import random_rows

from integration import gpu_accept as ga
from integration.hook import REQUIRED, describe

BUDGETS = (16, 64, 128)


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 2**32 if v >= 2**31 else v


def fork_loop_walk(cand: list[int], tgt: list[int], nt: list[int], ns: list[int]):
    """One row the fork's way: (next_token_ids, commit_len, path as row-local node indices
    padded -1). A link >= S (out of bounds in the fork) ends the chain, as in the contract."""
    s = len(cand)
    block = 1 << max(s - 1, 0).bit_length()
    out, path = [0] * s, [-1] * s
    path[0] = 0
    cur, n = 0, 1
    for _ in range(block - 1):
        in_range = n < s
        want = tgt[cur] if in_range else 0
        child = _i32(nt[cur]) if in_range else -1
        found = -1
        for _ in range(block):
            if not (in_range and 0 <= child < s and found < 0):
                child = -1
                continue
            if cand[child] == want:
                found = child
            child = _i32(ns[child])
        if in_range and found >= 0:
            out[n - 1] = want
            path[n] = found
            cur = found
            n += 1
    out[n - 1] = tgt[cur]
    return out, n, path


def python_rows(c, t, nt, ns):
    """fork_loop_walk over every row, as the contract's three tensors."""
    b, s = c.shape
    ids, lens, acc = [], [], []
    for r in range(b):
        o, n, p = fork_loop_walk(c[r].tolist(), t[r].tolist(), nt[r].tolist(), ns[r].tolist())
        ids.append(o)
        lens.append(n)
        acc.append([r * s + x if x >= 0 else -1 for x in p])
    return (
        torch.tensor(ids, dtype=torch.int64).view(b, s),
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor(acc, dtype=torch.int64).view(b, s),
    )


def garbage_rows(batch: int, stride: int, *, seed: int, links: torch.dtype = torch.int64):
    """Malformed links (cycles, self-links, the root as a child, -5, S + 2, int64 values
    whose low 32 bits are a node): the fork's loop bounds decide these answers."""
    g = random.Random(seed)
    pick = [-5, -1, stride, stride + 2]
    if links == torch.int64:
        pick += [2**32 + 1, 2**33 - 1, -(2**32) + 2]

    def link() -> int:
        return g.choice(pick) if g.random() < 0.15 else g.randrange(stride)

    c = torch.tensor([[g.randrange(3) for _ in range(stride)] for _ in range(batch)])
    t = torch.tensor([[g.randrange(3) for _ in range(stride)] for _ in range(batch)])
    nt = torch.tensor([[link() for _ in range(stride)] for _ in range(batch)], dtype=links)
    ns = torch.tensor([[link() for _ in range(stride)] for _ in range(batch)], dtype=links)
    return c, t, nt, ns


def _same(got, want) -> bool:
    return all(torch.equal(a.cpu(), b) for a, b in zip(got, want, strict=True))


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("budget", BUDGETS)
def test_reference_matches_the_forks_loop_on_random_trees_with_ties(budget: int) -> None:
    rows = 0
    cases = [(40, torch.int32), (40, torch.int64), (20, torch.int32)]
    for seed, (batch, links) in enumerate(cases):
        c, t, nt, ns = random_rows(
            batch, budget + 1, seed=seed + 100 * budget, links=links, high_bits=seed == 2
        )
        assert _same(ga.reference(c, t, nt, ns), python_rows(c, t, nt, ns))
        rows += batch
    assert rows == 100


def test_reference_matches_the_forks_loop_on_malformed_links() -> None:
    for seed, s in enumerate([1, 2, 3, 5, 17, 33, 65]):
        for links in (torch.int32, torch.int64):
            c, t, nt, ns = garbage_rows(30, s, seed=seed, links=links)
            assert _same(ga.reference(c, t, nt, ns), python_rows(c, t, nt, ns)), (s, links)


def test_random_rows_do_tie_and_accept() -> None:
    """The generator's trees hold the cases the bit-exact tests are about."""
    c, t, nt, ns = random_rows(200, 65, seed=7)
    _, lens, _ = ga.reference(c, t, nt, ns)
    assert int(lens.max()) >= 8 and float(lens.float().mean()) > 2
    ties = 0
    for r in range(200):
        for i in range(65):
            seen, k = set(), int(nt[r, i])
            while k >= 0:
                ties += int(c[r, k]) in seen
                seen.add(int(c[r, k]))
                k = int(ns[r, k])
    assert ties > 200


def test_ties_go_to_the_first_sibling_in_link_order() -> None:
    # root's children linked 3 -> 1 -> 2; nodes 3 and 1 both carry token 7; target after root 7
    c = torch.tensor([[0, 7, 8, 7]])
    t = torch.tensor([[7, 50, 60, 70]])
    nt = torch.tensor([[3, -1, -1, -1]], dtype=torch.int32)
    ns = torch.tensor([[-1, 2, -1, 1]], dtype=torch.int32)
    ids, lens, acc = ga.reference(c, t, nt, ns)
    assert lens.tolist() == [2] and acc.tolist() == [[0, 3, -1, -1]]
    assert ids.tolist() == [[7, 70, 0, 0]]  # the root's target, then the bonus after node 3


def test_row_offsets_and_padding() -> None:
    c, t, nt, ns = random_rows(5, 17, seed=3, p_match=1.0, p_full=1.0)
    ids, lens, acc = ga.reference(c, t, nt, ns)
    for r in range(5):
        n = int(lens[r])
        assert acc[r, 0] == r * 17 and (acc[r, n:] == -1).all() and (ids[r, n:] == 0).all()
        assert ((acc[r, :n] >= r * 17) & (acc[r, :n] < (r + 1) * 17)).all()


def test_the_dropin_has_the_forks_signature() -> None:
    fn = ga.make_gpu_accept("cuda", lambda *a: None)
    assert fn.__name__ == ga.FORK_FUNCTION
    # the hook's CONTRACTS entry this module proposes: seven required positional-or-keyword
    assert describe(fn) == tuple((p, "POSITIONAL_OR_KEYWORD", REQUIRED) for p in ga.PARAMS)
    assert list(inspect.signature(fn).parameters) == list(ga.PARAMS)


def _outputs(b: int, s: int, device: str = "cpu"):
    return (
        torch.full((b, s), 0x5A5A, dtype=torch.int64, device=device),
        torch.full((b,), -7, dtype=torch.int32, device=device),
        torch.full((b, s), 0x5A5A, dtype=torch.int64, device=device),
    )


class Spy:
    """A stand-in for the fork's function: records its calls, then answers as the oracle."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple] = []
        self.error = error

    def __call__(self, *args):
        self.calls.append(args)
        if self.error is not None:
            raise self.error
        ga.reference_into(*args)
        return None


def test_cpu_tensors_go_to_the_stock_function_unchanged() -> None:
    spy = Spy()
    fn = ga.make_gpu_accept("cuda", spy)
    inputs = random_rows(4, 17, seed=1)
    outs = _outputs(4, 17)
    assert fn(*inputs, *outs) is None
    assert len(spy.calls) == 1 and all(
        a is b for a, b in zip(spy.calls[0], (*inputs, *outs), strict=True)
    )
    assert _same(outs, ga.reference(*inputs))


def test_the_stock_functions_error_is_the_callers() -> None:
    fn = ga.make_gpu_accept("cuda", Spy(ValueError("requires contiguous candidates")))
    c, t, nt, ns = random_rows(2, 17, seed=2)
    with pytest.raises(ValueError, match="contiguous candidates"):
        fn(c.t(), t, nt, ns, *_outputs(2, 17))


def test_without_a_stock_function_the_oracle_answers() -> None:
    fn = ga.make_gpu_accept("cuda")
    inputs = random_rows(6, 33, seed=4, links=torch.int64)
    outs = _outputs(6, 33)
    fn(*inputs, *outs)
    assert _same(outs, ga.reference(*inputs))


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="triton"):
        ga.make_gpu_accept("triton")
    with pytest.raises(ValueError, match="not one of"):
        ga.check_backend("cpp")


def test_scan_cap_is_the_forks_block() -> None:
    assert [ga.scan_cap(s) for s in (1, 2, 16, 17, 65, 129)] == [1, 2, 16, 32, 128, 256]


# ----------------------------------------------------------------------------- GPU


def _cuda_cases():
    """(name, inputs) per case: >= 2000 rows per budget over batches 1-64, both link dtypes,
    high-bit tokens; plus malformed links."""
    seed = 0
    for budget in BUDGETS:
        for batch in (1, 2, 8, 17, 32, 64):
            for links in (torch.int32, torch.int64):
                for rep in range(10):
                    seed += 1
                    yield (
                        (budget, batch, links),
                        random_rows(
                            batch,
                            budget + 1,
                            seed=seed,
                            links=links,
                            high_bits=rep == 9,
                            p_match=(0.6, 0.8, 0.95, 1.0)[rep % 4],
                            p_tie=(0.3, 0.6)[rep % 2],
                        ),
                    )
    for s in (1, 2, 17, 65, 129):
        for links in (torch.int32, torch.int64):
            seed += 1
            yield ("garbage", s, links), garbage_rows(64, s, seed=seed, links=links)


def _run(fn, inputs, device="cuda"):
    ins = [x.to(device) for x in inputs]
    b, s = ins[0].shape
    outs = _outputs(b, s, device)
    fn(*ins, *outs)
    return outs


@pytest.mark.gpu
def test_cuda_and_triton_are_bit_exact_with_the_oracle() -> None:
    from helpers.triton_accept import triton_accept

    ours = ga.make_gpu_accept("cuda", Spy(AssertionError("fell back")))
    rows = {"cuda": 0, "garbage": 0}
    for name, inputs in _cuda_cases():
        want = ga.reference(*inputs)
        got_cuda = _run(ours, inputs)
        got_triton = _run(triton_accept, inputs)
        torch.cuda.synchronize()
        assert _same(got_cuda, want), ("cuda", name)
        assert _same(got_triton, want), ("triton", name)
        rows["garbage" if name[0] == "garbage" else "cuda"] += inputs[0].shape[0]
    assert rows["cuda"] == 3 * 124 * 2 * 10 and rows["garbage"] == 640  # 7440 + 640 rows


@pytest.mark.gpu
def test_inputs_the_fast_path_declines_go_to_stock() -> None:
    spy = Spy()
    fn = ga.make_gpu_accept("cuda", spy)
    c, t, nt, ns = (x.cuda() for x in random_rows(4, 17, seed=9))
    ids, lens, acc = _outputs(4, 17, "cuda")
    wide = torch.zeros((4, 20), dtype=torch.int64, device="cuda")
    cases = {
        "non-contiguous": (c.t().contiguous().t(), t, nt, ns, ids, lens, acc),
        "int32 candidates": (c.int(), t, nt, ns, ids, lens, acc),
        "int64 commit lens": (c, t, nt, ns, ids, lens.long(), acc),
        "mixed links": (c, t, nt.long(), ns, ids, lens, acc),
        "wider outputs": (c, t, nt, ns, wide, lens, acc),
        "a cpu tensor": (c, t.cpu(), nt, ns, ids, lens, acc),
        "empty batch": tuple(x[:0] for x in (c, t, nt, ns, ids, lens, acc)),
    }
    for name, args in cases.items():
        before = len(spy.calls)
        fn(*args)
        assert len(spy.calls) == before + 1, name
        assert all(a is b for a, b in zip(spy.calls[-1], args, strict=True)), name
    ids.fill_(0x5A5A)
    fn(c, t, nt, ns, ids, lens, acc)  # the taken case: no call to stock
    torch.cuda.synchronize()
    assert len(spy.calls) == len(cases)
    assert _same((ids, lens, acc), ga.reference(c, t, nt, ns))


@pytest.mark.gpu
def test_the_dropin_replays_in_a_cuda_graph() -> None:
    fn = ga.make_gpu_accept("cuda", Spy(AssertionError("fell back")))
    ins = [x.cuda() for x in random_rows(8, 65, seed=11)]
    outs = _outputs(8, 65, "cuda")
    fn(*ins, *outs)  # warm: the library is loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*ins, *outs)
    for seed in (12, 13):
        new = random_rows(8, 65, seed=seed)
        for dst, src in zip(ins, new, strict=True):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert _same(outs, ga.reference(*new))
