// kv_compact.cu: move each request's accepted tree rows to consecutive KV positions L_b, L_b+1..
//
// Overlap safety (rows are moved in place). Let a_0 = 0 < a_1 < ... < a_{n-1} be the accepted
// tree indices (a root-to-node path: a parent's index is smaller than its child's). Row k is
// read from position L + a_k and written to L + k. Since a_k >= k, dst <= src. Processing k in
// increasing order, the write of L + k can only clobber a source still to be read if
// L + a_{k'} == L + k for some k' > k; but a_{k'} > a_k >= k, so never. Each thread owns one
// 16-byte column chunk of the row and walks k = 1, 2, ... in that order; two chunks at
// different column offsets never alias, so a thread's program order alone makes the move
// correct, with no barrier and no scratch buffer. One block per request; requests own disjoint
// pages (positions of different requests never share a slot).
#include <cuda_runtime.h>
#include <stdint.h>

#include "ddtree_attention.h"

namespace {

constexpr int kRowElems = 576;

__global__ void kv_compact_kernel(char* __restrict__ kv, const int32_t* __restrict__ block_table,
                                  const int32_t* __restrict__ prefix_lens,
                                  const int32_t* __restrict__ accepted, int a_max, int page_size,
                                  int max_pages, int row_bytes) {
  const int b = blockIdx.x;
  const int64_t prefix = prefix_lens[b];
  const int32_t* acc = accepted + static_cast<int64_t>(b) * a_max;
  const int32_t* table = block_table + static_cast<int64_t>(b) * max_pages;
  const int chunks = row_bytes / 16;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    for (int k = 1; k < a_max; ++k) {
      const int a = acc[k];
      if (a < 0) break;
      if (a == k) continue;
      const int64_t src_pos = prefix + a, dst_pos = prefix + k;
      const int64_t src_slot =
          static_cast<int64_t>(table[src_pos / page_size]) * page_size + src_pos % page_size;
      const int64_t dst_slot =
          static_cast<int64_t>(table[dst_pos / page_size]) * page_size + dst_pos % page_size;
      const uint4 v = *reinterpret_cast<const uint4*>(kv + src_slot * row_bytes + c * 16);
      *reinterpret_cast<uint4*>(kv + dst_slot * row_bytes + c * 16) = v;
    }
  }
}

}  // namespace

extern "C" int ddtree_compact_kv(void* kv_cache, const int32_t* block_table,
                                 const int32_t* prefix_lens, const int32_t* accepted, int batch,
                                 int a_max, int page_size, int max_pages, int elem_bytes,
                                 cudaStream_t stream) {
  if (batch < 0 || a_max < 0 || page_size < 1 || max_pages < 0 ||
      (elem_bytes != 2 && elem_bytes != 4))
    return static_cast<int>(cudaErrorInvalidValue);
  if (batch == 0 || a_max <= 1) return 0;
  if (!kv_cache || !block_table || !prefix_lens || !accepted ||
      (reinterpret_cast<uintptr_t>(kv_cache) & 15))
    return static_cast<int>(cudaErrorInvalidValue);
  const int row_bytes = kRowElems * elem_bytes;
  const int threads = row_bytes / 16;  // 72 (bf16) or 144 (fp32): one chunk per thread
  kv_compact_kernel<<<batch, threads, 0, stream>>>(static_cast<char*>(kv_cache), block_table,
                                                   prefix_lens, accepted, a_max, page_size,
                                                   max_pages, row_bytes);
  return static_cast<int>(cudaGetLastError());
}
