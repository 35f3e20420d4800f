/* ddtree_retrieve_accept.h: C ABI of the greedy accept walk in the SGLang fork's layout.
 *
 * The fork (SyJarvis/sglang, dflash_ddtree_info.py at 4b08d3cc) walks each verified tree on the
 * GPU from per-row tensors of width S = 1 + budget, the root at column 0:
 *   candidates    int64 [B, S]  token of each node (column 0: the root, never compared)
 *   target_top1   int64 [B, S]  the target's greedy token after each node
 *   next_token    int32 or int64 [B, S]  first child of each node, -1: none
 *   next_sibling  int32 or int64 [B, S]  next sibling of each node, -1: none
 * Outputs: next_token_ids int64 [B, S] (target_top1 along the accepted path, then 0),
 * commit_lens int32 [B] (root + accepted nodes), accept_index int64 [B, S] (b * S + node along
 * the path, then -1).
 *
 * The walk: from the root, scan the children of the current node in link order and move to the
 * first whose candidate equals target_top1[current]; stop when none does. Links are read as
 * int32 (an int64 link is truncated, as the fork's kernel does); a link < 0 or >= S ends a
 * chain; at most next_pow2(S) children are scanned per step and the path stops at S nodes (the
 * fork's loop bounds, so that even cyclic links give the fork's answer).
 *
 * All tensors dense, row-major, contiguous, on one device; launched on `stream`; returns a
 * cudaError_t value (0 = success; cudaErrorInvalidValue for bad arguments, nothing launched).
 * Not part of ddtree_kernels.h's versioned ABI: a library without this symbol simply lacks it.
 */
#ifndef DDTREE_RETRIEVE_ACCEPT_H_
#define DDTREE_RETRIEVE_ACCEPT_H_

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of the link tensors. */
#define DDTREE_LINK_INT32 0
#define DDTREE_LINK_INT64 1

/* Widest row taken (S = 1 + budget). */
#define DDTREE_RETRIEVE_MAX_STRIDE 1025

int ddtree_retrieve_accept(const int64_t* candidates, const int64_t* target_top1,
                           const void* next_token, const void* next_sibling, int link_dtype,
                           int batch, int stride, int64_t* next_token_ids, int32_t* commit_lens,
                           int64_t* accept_index, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_RETRIEVE_ACCEPT_H_ */
