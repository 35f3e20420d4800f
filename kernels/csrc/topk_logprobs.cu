// topk_logprobs.cu: fused top-k log-probs over the last axis of [rows, vocab] logits (bf16 or
// fp32), sorted by logit descending with ties by smaller token id, log_prob = logit -
// logsumexp(row) in float32. Nothing of the row is copied to the host.
//
// One block per row, two passes over the row:
//  1. stream the row once: per-thread online max / sum-exp, and the thread's maximum; the k-th
//     largest of the per-thread maxima (exact bitwise search, __syncthreads-counted) is a
//     threshold t with at least k elements >= t;
//  2. stream it again (from L2: one 1024-thread block per SM keeps ~132 rows, ~42 MB of bf16,
//     in flight) and append every element >= t to shared memory; each candidate's rank among
//     the (key desc, id asc) composites (counted, or a bitonic sort when there are many)
//     places it in the output.
// If more than kCap elements pass t (heavy ties), an exact fallback finds the k-th largest
// (key, id) composite by bitwise search over the row, then collects exactly k elements.
#include <cfloat>

#include "ddtree_common.cuh"

namespace {

constexpr int kThreads = 1024;  // one block (one row) per SM keeps the rows in flight within L2
constexpr int kCap = 4096;  // candidates kept in shared memory
constexpr int kMaxK = 512;
constexpr int kUnroll = 4;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint64_t composite(uint32_t key, uint32_t id) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - id);
}

struct SharedTopk {
  uint64_t cand[kCap];
  uint64_t red64[32];
  uint32_t red32[32];
  float redm[32];
  float reds[32];
  unsigned int count;
};

// Sorts s.cand[0..n) descending (n a power of two <= kCap).
__device__ void bitonic_desc(uint64_t* a, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < n / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const bool desc = (i & size) == 0;
        const uint64_t x = a[i], y = a[j];
        if ((x < y) == desc) { a[i] = y; a[j] = x; }
      }
      __syncthreads();
    }
  }
}

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
    topk_kernel(const T* __restrict__ logits, int64_t V, int K, float* __restrict__ out_lp,
                int64_t* __restrict__ out_ids) {
  __shared__ SharedTopk s;
  const int64_t r = blockIdx.x;
  const T* row = logits + r * V;
  const int tid = threadIdx.x;

  // Pass 1: online max / sum-exp (base 2) and the thread's max key. m starts at -FLT_MAX, not
  // -inf, so -inf logits add exp2(-inf) = 0 and never make a NaN.
  float m = -FLT_MAX, acc = 0.0f;
  ddtree::for_row_chunks<T, VEC, kThreads, kUnroll>(row, V, [&](int64_t, const auto& x) {
    constexpr int N = sizeof(x) / sizeof(float);
    float cm = x[0];
#pragma unroll
    for (int e = 1; e < N; ++e) cm = fmaxf(cm, x[e]);
    if (cm > m) {
      acc *= ddtree::fast_exp2((m - cm) * kLog2e);
      m = cm;
    }
#pragma unroll
    for (int e = 0; e < N; ++e) acc += ddtree::fast_exp2((x[e] - m) * kLog2e);
  });
  // A thread that saw nothing above -FLT_MAX keeps key 0 (below every element).
  const uint32_t tkey = m > -FLT_MAX ? ddtree::float_key(m) : 0u;
  // Combine (m, acc) across the block.
  {
    const int lane = tid & 31, warp = tid >> 5;
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), a2 = __shfl_xor_sync(0xffffffffu, acc, o);
      const float mm = fmaxf(m, m2);
      acc = acc * exp2f((m - mm) * kLog2e) + a2 * exp2f((m2 - mm) * kLog2e);
      m = mm;
    }
    if (lane == 0) { s.redm[warp] = m; s.reds[warp] = acc; }
    if (tid == 0) s.count = 0;
    __syncthreads();
    m = -FLT_MAX;
    acc = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) {
      const float m2 = s.redm[w], a2 = s.reds[w];
      const float mm = fmaxf(m, m2);
      acc = acc * exp2f((m - mm) * kLog2e) + a2 * exp2f((m2 - mm) * kLog2e);
      m = mm;
    }
  }
  const float lse = m + log2f(acc) / kLog2e;

  // Threshold: the K-th largest per-thread maximum key (bitwise search; for bf16 only the top
  // 16 key bits vary, so t keeps its low 16 bits 0: still >= K maxima at or above it).
  uint32_t t = 0;
  for (int bit = 31; bit >= (sizeof(T) == 2 ? 16 : 0); --bit) {
    const uint32_t c = t | (1u << bit);
    if (__syncthreads_count(tkey >= c) >= K) t = c;
  }

  // Pass 2: collect every element with key >= t (a float compare; -0.0 == +0.0 as in keys).
  const float tf = t == 0 ? -INFINITY : ddtree::key_float(t);
  ddtree::for_row_chunks<T, VEC, kThreads, kUnroll>(row, V, [&](int64_t i0, const auto& x) {
    constexpr int N = sizeof(x) / sizeof(float);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      if (x[e] >= tf) {
        const unsigned pos = atomicAdd(&s.count, 1u);
        if (pos < kCap) s.cand[pos] = composite(ddtree::float_key(x[e]), static_cast<uint32_t>(i0 + e));
      }
    }
  });
  __syncthreads();
  unsigned n = s.count;
  if (n > kCap) {
    // Exact fallback: the K-th largest composite, 32 key bits then the id bits.
    uint64_t c = 0;
    int id_bits = 1;
    while ((int64_t(1) << id_bits) < V) ++id_bits;
    for (int bit = 63; bit >= 0; --bit) {
      if (bit < 32 && bit >= id_bits) { c |= uint64_t(1) << bit; continue; }
      const uint64_t probe = c | (uint64_t(1) << bit);
      uint32_t cnt = 0;
      ddtree::for_row<T, VEC, kThreads, kUnroll>(row, V, [&](int64_t i, float x) {
        cnt += composite(ddtree::float_key(x), static_cast<uint32_t>(i)) >= probe;
      });
      if (ddtree::block_sum_u32(cnt, s.red32) >= static_cast<uint32_t>(K)) c = probe;
    }
    __syncthreads();
    if (tid == 0) s.count = 0;
    __syncthreads();
    ddtree::for_row<T, VEC, kThreads, kUnroll>(row, V, [&](int64_t i, float x) {
      const uint64_t cc = composite(ddtree::float_key(x), static_cast<uint32_t>(i));
      if (cc >= c) s.cand[atomicAdd(&s.count, 1u)] = cc;
    });
    __syncthreads();
    n = s.count;
  }
  if (n <= kThreads) {
    // Few candidates (the usual case): each finds its rank by counting (composites are
    // distinct, n >= K) and writes itself if it is in the top K.
    if (tid < static_cast<int>(n)) {
      const uint64_t cc = s.cand[tid];
      int rank = 0;
      for (unsigned j = 0; j < n; ++j) rank += s.cand[j] > cc;
      if (rank < K) {
        const float x = ddtree::key_float(static_cast<uint32_t>(cc >> 32));
        out_lp[r * K + rank] = x - lse;
        out_ids[r * K + rank] = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(cc));
      }
    }
    return;
  }
  int p = 1;
  while (p < static_cast<int>(n) || p < K) p <<= 1;
  for (int i = n + tid; i < p; i += kThreads) s.cand[i] = 0;
  __syncthreads();
  bitonic_desc(s.cand, p);
  for (int i = tid; i < K; i += kThreads) {
    const uint64_t cc = s.cand[i];
    const float x = ddtree::key_float(static_cast<uint32_t>(cc >> 32));
    out_lp[r * K + i] = x - lse;
    out_ids[r * K + i] = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(cc));
  }
}

template <typename T>
cudaError_t launch(const void* logits, int64_t rows, int64_t V, int K, float* lp, int64_t* ids,
                   cudaStream_t stream) {
  const bool vec = ddtree::rows_vectorizable<T>(logits, V);
  const T* x = static_cast<const T*>(logits);
  if (vec) topk_kernel<T, true><<<rows, kThreads, 0, stream>>>(x, V, K, lp, ids);
  else topk_kernel<T, false><<<rows, kThreads, 0, stream>>>(x, V, K, lp, ids);
  return cudaGetLastError();
}

}  // namespace

extern "C" int ddtree_topk_logprobs(const void* logits, int dtype, int64_t rows, int64_t vocab,
                                    int k, float* out_log_probs, int64_t* out_token_ids,
                                    cudaStream_t stream) {
  if (rows < 0 || rows > 0x7fffffff || vocab < 1 || vocab > 0x7fffffff || k < 1 || k > kMaxK ||
      k > vocab)
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (!logits || !out_log_probs || !out_token_ids) return cudaErrorInvalidValue;
  if (dtype == DDTREE_DTYPE_FLOAT32)
    return launch<float>(logits, rows, vocab, k, out_log_probs, out_token_ids, stream);
  if (dtype == DDTREE_DTYPE_BFLOAT16)
    return launch<__nv_bfloat16>(logits, rows, vocab, k, out_log_probs, out_token_ids, stream);
  return cudaErrorInvalidValue;
}
