// greedy_accept.cu: the greedy accept walk over a batch of DDTrees, from per-node target ids
// or fused with the argmax over the verify logits [B, budget+1, V].
//
// One block per request. The tree's links and tokens are staged in shared memory (one
// coalesced read), then a single thread walks from the root: while a child of cur (scanned
// in first_child / next_sibling order) carries target[cur], move to it. The fused variant
// computes target[cur] on demand, as a block-wide argmax of row cur (ties by smaller id), so
// only the rows on the accepted path are read.
#include "ddtree_common.cuh"

namespace {

constexpr int kIdThreads = 128;
constexpr int kLogitThreads = 1024;
constexpr int kLogitUnroll = 8;

struct TreeView {
  int* tok;  // [budget]: token of node i+1
  int* fc;   // [n1]
  int* ns;   // [n1]
};

__device__ inline TreeView stage_tree(char* base, const int64_t* token_ids,
                                      const int64_t* first_child, const int64_t* next_sibling,
                                      int b, int budget) {
  const int n1 = budget + 1;
  TreeView t;
  t.tok = reinterpret_cast<int*>(base);
  t.fc = t.tok + budget;
  t.ns = t.fc + n1;
  const int64_t ob = b;
  for (int i = threadIdx.x; i < budget; i += blockDim.x)
    t.tok[i] = static_cast<int>(token_ids[ob * budget + i]);
  for (int i = threadIdx.x; i < n1; i += blockDim.x) {
    t.fc[i] = static_cast<int>(first_child[ob * n1 + i]);
    t.ns[i] = static_cast<int>(next_sibling[ob * n1 + i]);
  }
  return t;
}

// The child of cur whose token is target, or -1.
__device__ inline int find_child(const TreeView& t, int cur, int64_t target, int budget) {
  int c = t.fc[cur];
  int guard = 0;
  while (c >= 1 && c <= budget && guard++ <= budget) {
    if (t.tok[c - 1] == target) return c;
    c = t.ns[c];
  }
  return -1;
}

__device__ inline void write_outputs(const int* path, int len, int64_t bonus, int b,
                                     int max_depth, int64_t* accepted, int64_t* accept_len,
                                     int64_t* bonus_out) {
  const int w = max_depth + 1;
  for (int i = threadIdx.x; i < w; i += blockDim.x)
    accepted[static_cast<int64_t>(b) * w + i] = i < len ? path[i] : -1;
  if (threadIdx.x == 0) {
    accept_len[b] = len;
    bonus_out[b] = bonus;
  }
}

__global__ void __launch_bounds__(kIdThreads)
    accept_ids_kernel(const int64_t* __restrict__ token_ids, const int64_t* __restrict__ fc,
                      const int64_t* __restrict__ ns, int budget,
                      const int64_t* __restrict__ target, int max_depth,
                      int64_t* __restrict__ accepted, int64_t* __restrict__ accept_len,
                      int64_t* __restrict__ bonus) {
  extern __shared__ __align__(16) char smem[];
  __shared__ int path[DDTREE_MAX_DEPTH + 2];
  __shared__ int s_len;
  __shared__ long long s_bonus;
  const int b = blockIdx.x, n1 = budget + 1;
  const TreeView t = stage_tree(smem, token_ids, fc, ns, b, budget);
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t* tg = target + static_cast<int64_t>(b) * n1;
    int cur = 0, len = 0;
    path[len++] = 0;
    int64_t want = tg[0];
    while (len <= max_depth) {
      const int c = find_child(t, cur, want, budget);
      if (c < 0) break;
      cur = c;
      path[len++] = c;
      want = tg[cur];
    }
    s_len = len;
    s_bonus = want;
  }
  __syncthreads();
  write_outputs(path, s_len, s_bonus, b, max_depth, accepted, accept_len, bonus);
}

template <typename T, bool VEC>
__global__ void __launch_bounds__(kLogitThreads)
    accept_logits_kernel(const int64_t* __restrict__ token_ids, const int64_t* __restrict__ fc,
                         const int64_t* __restrict__ ns, int budget, const T* __restrict__ logits,
                         int64_t V, int max_depth, int64_t* __restrict__ accepted,
                         int64_t* __restrict__ accept_len, int64_t* __restrict__ bonus) {
  extern __shared__ __align__(16) char smem[];
  __shared__ int path[DDTREE_MAX_DEPTH + 2];
  __shared__ uint64_t scratch[32];
  __shared__ int s_next;
  const int b = blockIdx.x, n1 = budget + 1;
  const TreeView t = stage_tree(smem, token_ids, fc, ns, b, budget);
  __syncthreads();
  const T* base = logits + static_cast<int64_t>(b) * n1 * V;
  int cur = 0, len = 0;
  int64_t want = 0;
  if (threadIdx.x == 0) path[0] = 0;
  len = 1;
  while (true) {
    uint64_t best = 0;
    ddtree::for_row<T, VEC, kLogitThreads, kLogitUnroll>(
        base + static_cast<int64_t>(cur) * V, V, [&](int64_t i, float x) {
          const uint64_t c = (static_cast<uint64_t>(ddtree::float_key(x)) << 32) |
                             (0xffffffffu - static_cast<uint32_t>(i));
          best = c > best ? c : best;
        });
    best = ddtree::block_max_u64(best, scratch);
    want = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(best));
    if (len > max_depth) break;
    if (threadIdx.x == 0) s_next = find_child(t, cur, want, budget);
    __syncthreads();
    const int c = s_next;
    if (c < 0) break;
    cur = c;
    if (threadIdx.x == 0) path[len] = c;
    ++len;
  }
  __syncthreads();
  write_outputs(path, len, want, b, max_depth, accepted, accept_len, bonus);
}

// token ids [budget] + first_child [budget+1] + next_sibling [budget+1], as int32.
inline size_t tree_smem(int budget) { return (3 * static_cast<size_t>(budget) + 2) * 4; }

inline cudaError_t allow_smem(const void* fn, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem));
}

bool bad_args(const int64_t* tok, const int64_t* fc, const int64_t* ns, int batch, int budget,
              int max_depth, const int64_t* acc, const int64_t* len, const int64_t* bonus) {
  return batch < 0 || batch > 0x7fffffff || budget < 0 || budget > DDTREE_MAX_BUDGET ||
         max_depth < 0 || max_depth > DDTREE_MAX_DEPTH ||
         (batch > 0 && (!fc || !ns || !acc || !len || !bonus || (budget > 0 && !tok)));
}

template <typename T>
cudaError_t launch_logits(const int64_t* tok, const int64_t* fc, const int64_t* ns, int batch,
                          int budget, const void* logits, int64_t V, int max_depth,
                          int64_t* acc, int64_t* len, int64_t* bonus, cudaStream_t stream) {
  const T* x = static_cast<const T*>(logits);
  const size_t smem = tree_smem(budget);
  if (ddtree::rows_vectorizable<T>(logits, V)) {
    cudaError_t e = allow_smem(reinterpret_cast<const void*>(accept_logits_kernel<T, true>), smem);
    if (e != cudaSuccess) return e;
    accept_logits_kernel<T, true><<<batch, kLogitThreads, smem, stream>>>(
        tok, fc, ns, budget, x, V, max_depth, acc, len, bonus);
  } else {
    cudaError_t e = allow_smem(reinterpret_cast<const void*>(accept_logits_kernel<T, false>), smem);
    if (e != cudaSuccess) return e;
    accept_logits_kernel<T, false><<<batch, kLogitThreads, smem, stream>>>(
        tok, fc, ns, budget, x, V, max_depth, acc, len, bonus);
  }
  return cudaGetLastError();
}

}  // namespace

extern "C" int ddtree_greedy_accept(const int64_t* token_ids, const int64_t* first_child,
                                    const int64_t* next_sibling, int batch, int budget,
                                    const int64_t* target_ids, int max_depth, int64_t* accepted,
                                    int64_t* accept_len, int64_t* bonus, cudaStream_t stream) {
  if (bad_args(token_ids, first_child, next_sibling, batch, budget, max_depth, accepted,
               accept_len, bonus) ||
      (batch > 0 && !target_ids))
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const size_t smem = tree_smem(budget);
  cudaError_t e = allow_smem(reinterpret_cast<const void*>(accept_ids_kernel), smem);
  if (e != cudaSuccess) return e;
  accept_ids_kernel<<<batch, kIdThreads, smem, stream>>>(token_ids, first_child, next_sibling,
                                                         budget, target_ids, max_depth, accepted,
                                                         accept_len, bonus);
  return cudaGetLastError();
}

extern "C" int ddtree_greedy_accept_from_logits(const int64_t* token_ids,
                                                const int64_t* first_child,
                                                const int64_t* next_sibling, int batch,
                                                int budget, const void* logits, int dtype,
                                                int64_t vocab, int max_depth, int64_t* accepted,
                                                int64_t* accept_len, int64_t* bonus,
                                                cudaStream_t stream) {
  if (bad_args(token_ids, first_child, next_sibling, batch, budget, max_depth, accepted,
               accept_len, bonus) ||
      vocab < 1 || vocab > 0x7fffffff || (batch > 0 && !logits))
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (dtype == DDTREE_DTYPE_FLOAT32)
    return launch_logits<float>(token_ids, first_child, next_sibling, batch, budget, logits, vocab,
                                max_depth, accepted, accept_len, bonus, stream);
  if (dtype == DDTREE_DTYPE_BFLOAT16)
    return launch_logits<__nv_bfloat16>(token_ids, first_child, next_sibling, batch, budget,
                                        logits, vocab, max_depth, accepted, accept_len, bonus,
                                        stream);
  return cudaErrorInvalidValue;
}
