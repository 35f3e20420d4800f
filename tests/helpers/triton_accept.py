"""A Triton kernel of the fork's GPU accept contract, written here from the contract: the
baseline `benchmarks/gpu-accept.sh` times the project's CUDA drop-in against, and a second
implementation the GPU tests hold to the oracle (`integration.gpu_accept.reference`).

Contract: `integration.gpu_accept`'s docstring (the fork's
`_compute_ddtree_accept_triton_unchecked`, same seven parameters, outputs written in place).
One program per row, one warp for rows up to 256 wide: a data-dependent `while` loop walks
from the root (one child looked at per iteration, descending on a match, moving to the next
sibling otherwise) and stops as soon as no child matches; the path and the emitted tokens are
kept in registers as [BLOCK] vectors and each output row is written once, at the end.
Needs triton (and a GPU, or TRITON_INTERPRET=1 with CPU tensors); without triton the module
still imports and offers `random_rows`, the random trees both the tests and the bench use.
"""

from __future__ import annotations

import random

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only machines (CI): random_rows alone
    triton = None


def random_rows(
    batch: int,
    stride: int,
    *,
    seed: int,
    vocab: int = 6,
    p_match: float = 0.8,
    p_tie: float = 0.3,
    p_full: float = 0.7,
    high_bits: bool = False,
    links: torch.dtype = torch.int32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`batch` random trees in the fork's layout (CPU tensors): candidates int64 [B, S],
    target_top1 int64 [B, S], retrieve_next_token / _sibling [B, S] of dtype `links`.

    Each row holds S-1 nodes (probability p_full) or fewer, the rest padding as the fork's
    worker pads (links -1, candidate = the root's token). A node's parent is its predecessor
    (deep chains) or a random earlier node; siblings are linked in index order or shuffled.
    Tokens come from a small vocabulary, and with probability p_tie a node copies an earlier
    sibling's token, so ties across siblings are common. A node's target is a child's token
    with probability p_match (else random). high_bits: every token is t * 2^32 + 5, so tokens
    agree in their low 32 bits (a comparison that truncates would see ties everywhere)."""
    g = random.Random(seed)
    cand = [[0] * stride for _ in range(batch)]
    tgt = [[0] * stride for _ in range(batch)]
    nt = [[-1] * stride for _ in range(batch)]
    ns = [[-1] * stride for _ in range(batch)]
    for r in range(batch):
        n = stride - 1 if g.random() < p_full else g.randrange(stride)
        kids: list[list[int]] = [[] for _ in range(stride)]
        tok = [g.randrange(vocab) for _ in range(stride)]
        for i in range(1, n + 1):
            parent = i - 1 if g.random() < 0.5 else g.randrange(i)
            if kids[parent] and g.random() < p_tie:
                tok[i] = tok[g.choice(kids[parent])]
            kids[parent].append(i)
        for i in range(n + 1):
            order = kids[i]
            if g.random() < 0.5:
                g.shuffle(order)
            if order:
                nt[r][i] = order[0]
                for a, c in zip(order, order[1:], strict=False):
                    ns[r][a] = c
            want = tok[g.choice(order)] if order and g.random() < p_match else g.randrange(vocab)
            tgt[r][i] = want
        for i in range(n + 1, stride):  # padding
            tok[i] = tok[0]
            tgt[r][i] = g.randrange(vocab)
        cand[r] = tok
    c, t = torch.tensor(cand, dtype=torch.int64), torch.tensor(tgt, dtype=torch.int64)
    if high_bits:
        c, t = c * 2**32 + 5, t * 2**32 + 5
    return c, t, torch.tensor(nt, dtype=links), torch.tensor(ns, dtype=links)


def _walk_kernel(  # made a Triton kernel below, where triton is installed
    cand_ptr,
    tgt_ptr,
    nt_ptr,
    ns_ptr,
    ids_ptr,
    lens_ptr,
    acc_ptr,
    stride,
    scan_cap,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = row * stride
    cols = tl.arange(0, BLOCK)
    want = tl.load(tgt_ptr + base)  # the target's token after the current node
    child = tl.load(nt_ptr + base).to(tl.int32)
    n = tl.full((), 1, tl.int32)  # nodes on the path so far
    scanned = tl.full((), 0, tl.int32)  # children of the current node looked at
    path = tl.where(cols == 0, 0, -1).to(tl.int32)
    emitted = tl.zeros((BLOCK,), tl.int64)
    while (child >= 0) & (child < stride) & (n < stride) & (scanned < scan_cap):
        hit = tl.load(cand_ptr + base + child) == want
        first = tl.load(nt_ptr + base + child).to(tl.int32)
        sibling = tl.load(ns_ptr + base + child).to(tl.int32)
        after = tl.load(tgt_ptr + base + child)
        emitted = tl.where(hit & (cols == n - 1), want, emitted)
        path = tl.where(hit & (cols == n), child, path)
        want = tl.where(hit, after, want)
        n += hit.to(tl.int32)
        scanned = tl.where(hit, 0, scanned + 1)
        child = tl.where(hit, first, sibling)
    emitted = tl.where(cols == n - 1, want, emitted)  # the bonus token
    on = cols < n
    inb = cols < stride
    tl.store(ids_ptr + base + cols, tl.where(on, emitted, 0), mask=inb)
    tl.store(acc_ptr + base + cols, tl.where(on, base + path.to(tl.int64), -1), mask=inb)
    tl.store(lens_ptr + row, n)


if triton is not None:
    _walk_kernel = triton.jit(_walk_kernel)


def triton_accept(
    candidates: torch.Tensor,
    target_top1: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    next_token_ids_out: torch.Tensor,
    commit_lens_out: torch.Tensor,
    accept_index_out: torch.Tensor,
) -> None:
    """The contract on the tensors' device (contiguous [B, S] tensors; not checked further)."""
    b, s = candidates.shape
    if b == 0:
        return
    block = triton.next_power_of_2(s)
    _walk_kernel[(b,)](
        candidates,
        target_top1,
        retrieve_next_token,
        retrieve_next_sibling,
        next_token_ids_out,
        commit_lens_out,
        accept_index_out,
        s,
        block,
        BLOCK=block,
        num_warps=1 if block <= 256 else 4,
    )
