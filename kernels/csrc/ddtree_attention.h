/* ddtree_attention.h: C ABI of the tree-verify MLA attention and the KV compaction.
 *
 * Same conventions as ddtree_kernels.h: raw device pointers, an explicit stream, the result is a
 * cudaError_t value (0 = success; cudaErrorInvalidValue for bad arguments), never an exception.
 *
 * Ragged layout (see kernels/reference_attention.py, the float64 reference):
 *   q            [total_q, heads, 576]  total_q = sum_b T_b; request b's rows start at qo_offsets[b]
 *   kv_cache     [num_pages, page_size, 576]  latent (512) + rope (64); value = first 512 dims
 *   block_table  int32 [batch, max_pages]  position p of request b -> page block_table[b][p/ps]
 *   prefix_lens  int32 [batch]  L_b; the tree's own rows are at positions L_b .. L_b + T_b - 1
 *   qo_offsets   int32 [batch + 1]  qo_offsets[0] = 0, T_b = qo_offsets[b+1] - qo_offsets[b] >= 1
 *   visibility   uint8 [batch, t_max, t_max]  tree row i sees tree row j iff vis[b][i][j] != 0
 *   out          [total_q, heads, 512], same dtype as q and kv_cache
 * dtype DDTREE_ATTN_FLOAT32 (0) or DDTREE_ATTN_BFLOAT16 (1); fp32 accumulation in both.
 */
#ifndef DDTREE_ATTENTION_H_
#define DDTREE_ATTENTION_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDTREE_ATTN_FLOAT32 0
#define DDTREE_ATTN_BFLOAT16 1

/* algo (any other value: cudaErrorInvalidValue):
 *   auto         bf16 -> the first of wgmma_tma, mma_sync_64, mma_sync_32 that runs on the
 *                device and fits its shared memory; fp32 -> simt
 *   simt         fp32 FMA (float or bf16 storage)
 *   mma_sync_64  tensor cores, mma.sync, 64x64 tiles (bf16; sm_80+ with 225 KiB of shared
 *                memory a block, e.g. H100/H200; else cudaErrorInvalidConfiguration)
 *   mma_sync_32  tensor cores, mma.sync, 32x32 tiles (bf16; sm_80+, 75 KiB: sm_120 too)
 *   wgmma_tma    tensor cores, wgmma with TMA KV loads (bf16; an sm_90a build on H100/H200;
 *                elsewhere cudaErrorInvalidDeviceFunction) */
#define DDTREE_ATTN_AUTO 0
#define DDTREE_ATTN_SIMT 1
#define DDTREE_ATTN_MMA_SYNC_64 2
#define DDTREE_ATTN_MMA_SYNC_32 3
#define DDTREE_ATTN_WGMMA_TMA 4

/* Message for any code these functions return (cudaGetErrorString). */
const char* ddtree_attention_error_string(int code);

/* Plan a launch on the current device: the KV split count (flash-decoding) and the workspace
 * bytes it needs. max_kv_len is an upper bound hint on L_b + T_b used only for planning
 * (the kernel is correct for any actual lengths). num_splits_req > 0 forces that count. */
int ddtree_tree_verify_attention_plan(int dtype, int algo, int batch, int heads, int total_q,
                                      int t_max, int max_kv_len, int num_splits_req,
                                      int* num_splits, size_t* workspace_bytes);

/* Tree-verify attention. workspace: device memory of at least the planned bytes (may be
 * NULL when that is 0); num_splits as planned. */
int ddtree_tree_verify_attention(const void* q, const void* kv_cache, const int32_t* block_table,
                                 const int32_t* prefix_lens, const int32_t* qo_offsets,
                                 const uint8_t* visibility, void* out, void* workspace,
                                 size_t workspace_bytes, int dtype, int algo, int batch, int heads,
                                 int total_q, int t_max, int page_size, int max_pages,
                                 int max_kv_len, float scale, int num_splits,
                                 cudaStream_t stream);

/* KV compaction in place: for each request b and k = 1.. while accepted[b][k] >= 0, row
 * L_b + accepted[b][k] moves to row L_b + k. accepted int32 [batch, a_max], starting with 0,
 * strictly increasing, padded with -1. elem_bytes 2 (bf16) or 4 (fp32); rows of 576 elements. */
int ddtree_compact_kv(void* kv_cache, const int32_t* block_table, const int32_t* prefix_lens,
                      const int32_t* accepted, int batch, int a_max, int page_size, int max_pages,
                      int elem_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_ATTENTION_H_ */
