// retrieve_accept.cu: the greedy accept walk in the SGLang fork's layout (root at column 0,
// EAGLE-style first-child / next-sibling links), writing the fork's three outputs directly.
// Contract: ddtree_retrieve_accept.h. A thin sibling of greedy_accept.cu, whose kernels take
// another layout (tokens without the root, int64 links, a depth cap of 32) and stay as they are.
//
// One block per row: the row's tokens, targets and links are staged in shared memory in one
// coalesced pass, thread 0 walks from the root (shared-memory reads only, early exit), then the
// block writes the padded outputs in one pass.
#include <cuda_runtime.h>
#include <stdint.h>

#include "ddtree_retrieve_accept.h"

namespace {

constexpr int kThreads = 128;

// Bytes of shared memory per row: tokens + targets (int64), first child + next sibling + the
// path (int32).
inline size_t row_smem(int stride) { return static_cast<size_t>(stride) * (8 + 8 + 4 + 4 + 4); }

__host__ __device__ inline int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

template <typename L>
__global__ void __launch_bounds__(kThreads)
    retrieve_accept_kernel(const int64_t* __restrict__ candidates,
                           const int64_t* __restrict__ target, const L* __restrict__ next_token,
                           const L* __restrict__ next_sibling, int stride, int scan_cap,
                           int64_t* __restrict__ next_token_ids, int32_t* __restrict__ commit_lens,
                           int64_t* __restrict__ accept_index) {
  extern __shared__ __align__(16) char smem[];
  int64_t* tok = reinterpret_cast<int64_t*>(smem);
  int64_t* tgt = tok + stride;
  int* fc = reinterpret_cast<int*>(tgt + stride);
  int* ns = fc + stride;
  int* path = ns + stride;
  __shared__ int s_len;

  const int64_t base = static_cast<int64_t>(blockIdx.x) * stride;
  for (int i = threadIdx.x; i < stride; i += blockDim.x) {
    tok[i] = candidates[base + i];
    tgt[i] = target[base + i];
    fc[i] = static_cast<int>(static_cast<int32_t>(next_token[base + i]));  // truncated as the fork
    ns[i] = static_cast<int>(static_cast<int32_t>(next_sibling[base + i]));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int cur = 0, len = 1;
    path[0] = 0;
    while (len < stride) {
      const int64_t want = tgt[cur];
      int c = fc[cur], found = -1;
      for (int k = 0; k < scan_cap && c >= 0 && c < stride; ++k) {
        if (tok[c] == want) {
          found = c;
          break;
        }
        c = ns[c];
      }
      if (found < 0) break;
      path[len++] = found;
      cur = found;
    }
    s_len = len;
    commit_lens[blockIdx.x] = len;
  }
  __syncthreads();
  const int len = s_len;
  for (int i = threadIdx.x; i < stride; i += blockDim.x) {
    const bool on = i < len;
    const int p = on ? path[i] : 0;
    next_token_ids[base + i] = on ? tgt[p] : 0;
    accept_index[base + i] = on ? base + p : -1;
  }
}

template <typename L>
cudaError_t launch(const int64_t* cand, const int64_t* target, const void* nt, const void* ns,
                   int batch, int stride, int64_t* ids, int32_t* lens, int64_t* acc,
                   cudaStream_t stream) {
  const size_t smem = row_smem(stride);  // <= 28.7 KiB at the widest row: no opt-in needed
  retrieve_accept_kernel<L><<<batch, kThreads, smem, stream>>>(
      cand, target, static_cast<const L*>(nt), static_cast<const L*>(ns), stride,
      pow2_at_least(stride), ids, lens, acc);
  return cudaGetLastError();
}

}  // namespace

extern "C" int ddtree_retrieve_accept(const int64_t* candidates, const int64_t* target_top1,
                                      const void* next_token, const void* next_sibling,
                                      int link_dtype, int batch, int stride,
                                      int64_t* next_token_ids, int32_t* commit_lens,
                                      int64_t* accept_index, cudaStream_t stream) {
  if (batch < 0 || stride < 1 || stride > DDTREE_RETRIEVE_MAX_STRIDE ||
      (link_dtype != DDTREE_LINK_INT32 && link_dtype != DDTREE_LINK_INT64))
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (!candidates || !target_top1 || !next_token || !next_sibling || !next_token_ids ||
      !commit_lens || !accept_index)
    return cudaErrorInvalidValue;
  if (link_dtype == DDTREE_LINK_INT32)
    return launch<int32_t>(candidates, target_top1, next_token, next_sibling, batch, stride,
                           next_token_ids, commit_lens, accept_index, stream);
  return launch<int64_t>(candidates, target_top1, next_token, next_sibling, batch, stride,
                         next_token_ids, commit_lens, accept_index, stream);
}
