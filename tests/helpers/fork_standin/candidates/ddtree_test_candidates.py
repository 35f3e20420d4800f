"""Candidates for the hook's shadow that must never serve (tests): named as
`shadow:tree_build=ddtree_test_candidates:tie_flipped` with this directory on PYTHONPATH.

- `tie_flipped`: the fork's builder, but among candidates of equal score the LARGER rank path
  is popped first (the contract says the smaller): the same tree wherever no two scores tie,
  another one where they do (bf16-rounded log-probs tie often);
- `raises`: a builder that always raises;
- `follow_first_child`: an accept walk that always takes the first child (wrong whenever the
  target's token is another child's);
- `gpu_walk_last_tie`: the GPU accept walk's contract (outputs in place), but where several
  siblings carry the target's token the LAST in link order is taken (the contract: the first).
"""

from __future__ import annotations

import heapq

import numpy as np
import torch


def tie_flipped(top_log_probs, top_token_ids, budget):
    """The fork's 7-tuple, ties broken the other way (see the module's doc)."""
    if budget <= 0 or top_log_probs.shape[0] == 0:
        vis = torch.ones((1, 1), dtype=torch.bool)
        minus = torch.full((1,), -1, dtype=torch.long)
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty.clone(), [-1], [{}], vis, minus, minus.clone()
    cap = int(budget)
    k = min(cap, int(top_log_probs.shape[-1]))
    h = int(top_log_probs.shape[0])
    lp = top_log_probs[:, :k].to(device="cpu", dtype=torch.float32).numpy()
    ids = top_token_ids[:, :k].to(device="cpu", dtype=torch.long).numpy()
    w0 = float(lp[0, 0])
    # the contract's key is (-score, rank path); here the path's ranks are negated: among equal
    # scores the larger rank comes first (a prefix still before its extensions)
    heap = [(-w0, (0,), 0, 1, 0, w0)]
    tokens, depths, parents = [], [], [-1]
    maps: list[dict[int, int]] = [{}]
    while heap and len(tokens) < cap:
        _, path, par, d, r, w = heapq.heappop(heap)
        tok = int(ids[d - 1, r])
        tokens.append(tok)
        depths.append(d)
        parents.append(par)
        n = len(tokens)
        maps.append({})
        maps[par][tok] = n
        if r + 1 < k:
            ws = w - float(lp[d - 1, r]) + float(lp[d - 1, r + 1])
            heapq.heappush(heap, (-ws, path[:-1] + (-(r + 1),), par, d, r + 1, ws))
        if d < h:
            wc = w + float(lp[d, 0])
            heapq.heappush(heap, (-wc, path + (0,), n, d + 1, 0, wc))
    s = len(tokens) + 1
    vis = np.zeros((s, s), dtype=np.bool_)
    first = np.full(s, -1, dtype=np.int64)
    nxt = np.full(s, -1, dtype=np.int64)
    last = np.full(s, -1, dtype=np.int64)
    vis[0, 0] = True
    for i in range(1, s):
        vis[i, :i] = vis[parents[i], :i]
        vis[i, i] = True
        p = parents[i]
        if first[p] == -1:
            first[p] = i
        else:
            nxt[last[p]] = i
        last[p] = i
    t = torch.from_numpy
    return (
        torch.tensor(tokens, dtype=torch.long),
        torch.tensor(depths, dtype=torch.long),
        parents,
        maps,
        t(vis),
        t(first),
        t(nxt),
    )


def raises(top_log_probs, top_token_ids, budget):
    raise RuntimeError("this candidate always fails")


def follow_first_child(child_maps, posterior):
    tokens = posterior.tolist()
    path, node = [0], 0
    while child_maps[node]:
        node = next(iter(child_maps[node].values()))
        path.append(node)
    return path, int(tokens[node])


def gpu_walk_last_tie(
    candidates,
    target_top1,
    retrieve_next_token,
    retrieve_next_sibling,
    next_token_ids_out,
    commit_lens_out,
    accept_index_out,
):
    """The GPU walk with ties across siblings broken the other way (see the module's doc)."""
    b, s = candidates.shape
    rows = [
        x.tolist() for x in (candidates, target_top1, retrieve_next_token, retrieve_next_sibling)
    ]
    ids = torch.zeros((b, s), dtype=torch.int64)
    acc = torch.full((b, s), -1, dtype=torch.int64)
    lens = torch.zeros(b, dtype=torch.int32)
    for r in range(b):
        cand, tgt, first, after = (x[r] for x in rows)
        path, cur = [0], 0
        while len(path) < s:
            kids, child = [], first[cur]
            while 0 <= child < s and len(kids) < s:
                kids.append(child)
                child = after[child]
            hits = [k for k in kids if cand[k] == tgt[cur]]
            if not hits:
                break
            ids[r, len(path) - 1] = tgt[cur]
            cur = hits[-1]
            path.append(cur)
        ids[r, len(path) - 1] = tgt[cur]
        acc[r, : len(path)] = torch.tensor(path) + r * s
        lens[r] = len(path)
    next_token_ids_out[:, :s].copy_(ids)
    accept_index_out[:, :s].copy_(acc)
    commit_lens_out.copy_(lens)
