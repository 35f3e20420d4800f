/* ddtree_kernels.h: C ABI of the DDTree CUDA kernels (top-k, tree build, greedy accept).
 *
 * FlashInfer style: raw device pointers, an explicit stream, a return code that is a
 * cudaError_t value (0 = success), never an exception. All tensors are dense, row-major and
 * contiguous. Integer outputs are int64, visibility is one byte per entry (0/1).
 * ddtree_error_string(code) gives the message for any code these functions return.
 */
#ifndef DDTREE_KERNELS_H_
#define DDTREE_KERNELS_H_

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature or a constant below changes; the Python bindings refuse a
 * library whose ddtree_abi_version() differs from theirs. 2: ddtree_build_trees takes algo;
 * attention algo codes renamed (DDTREE_ATTN_* in ddtree_attention.h). */
#define DDTREE_ABI_VERSION 2

/* Logit element types. */
#define DDTREE_DTYPE_FLOAT32 0
#define DDTREE_DTYPE_BFLOAT16 1

/* Limits of the tree kernels. */
#define DDTREE_MAX_DEPTH 32   /* H */
#define DDTREE_MAX_K 1024     /* candidates per draft position */
#define DDTREE_MAX_BUDGET 512 /* nodes per tree, root excluded */

/* Tree-build algorithms (all give the same trees; see tree_build.cu). auto: the level
 * selection for budgets <= 64 with the heap loop as its fallback, the heap loop above;
 * levels: the level selection alone, num_nodes = -1 where it declines the input (tests);
 * heap: the heap loop alone; heap_lowmem: the loop that keeps only float32 log-probs in
 * shared memory (auto, levels and heap take it where the heap kernel's shared memory, 24 bytes
 * a top-K entry, passes 160 KiB). Any other value: cudaErrorInvalidValue. */
#define DDTREE_TREE_AUTO 0
#define DDTREE_TREE_LEVELS 1
#define DDTREE_TREE_HEAP 2
#define DDTREE_TREE_HEAP_LOWMEM 3

int ddtree_abi_version(void);
const char* ddtree_error_string(int code);

/* Top-k log-probs over the last axis of logits [rows, vocab] (dtype as above).
 * out_log_probs float32 [rows, k], out_token_ids int64 [rows, k]: sorted by logit descending,
 * ties by smaller token id; log_prob = logit - logsumexp(row) in float32. 1 <= k <= min(vocab, 512). */
int ddtree_topk_logprobs(const void* logits, int dtype, int64_t rows, int64_t vocab, int k,
                         float* out_log_probs, int64_t* out_token_ids, cudaStream_t stream);

/* Best-first DDTree build, tie-exact with liranringel/ddtree build_ddtree_tree, for a batch.
 * top_log_probs float32 [batch, depth, k], top_token_ids int64 [batch, depth, k].
 * Outputs (padded with -1 / 0): token_ids [batch, budget], depths [batch, budget],
 * parents [batch, budget+1], visibility uint8 [batch, budget+1, budget+1],
 * first_child [batch, budget+1], next_sibling [batch, budget+1], num_nodes [batch].
 * algo: DDTREE_TREE_* above. */
int ddtree_build_trees(const float* top_log_probs, const int64_t* top_token_ids, int batch,
                       int depth, int k, int budget, int64_t* token_ids, int64_t* depths,
                       int64_t* parents, uint8_t* visibility, int64_t* first_child,
                       int64_t* next_sibling, int64_t* num_nodes, int algo,
                       cudaStream_t stream);

/* Greedy accept walk from per-node target ids (int64 [batch, budget+1]).
 * Tree inputs as produced by ddtree_build_trees. Outputs: accepted int64 [batch, max_depth+1]
 * (node indices from 0, padded -1), accept_len int64 [batch], bonus int64 [batch]. The walk
 * stops after max_depth steps. */
int ddtree_greedy_accept(const int64_t* token_ids, const int64_t* first_child,
                         const int64_t* next_sibling, int batch, int budget,
                         const int64_t* target_ids, int max_depth, int64_t* accepted,
                         int64_t* accept_len, int64_t* bonus, cudaStream_t stream);

/* The same walk, fused with the argmax over verify logits [batch, budget+1, vocab] (dtype as
 * above; argmax ties by smaller id). Only the rows on the accepted path are read. */
int ddtree_greedy_accept_from_logits(const int64_t* token_ids, const int64_t* first_child,
                                     const int64_t* next_sibling, int batch, int budget,
                                     const void* logits, int dtype, int64_t vocab, int max_depth,
                                     int64_t* accepted, int64_t* accept_len, int64_t* bonus,
                                     cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_KERNELS_H_ */
