// tree_build.cu: batched best-first DDTree build on the GPU, tie-exact with
// liranringel/ddtree build_ddtree_tree (see kernels/reference.py for the contract).
//
// One block per request. Warp 0 runs the best-first loop: the frontier (at most `budget`
// candidates) lives in registers, S slots per lane; each pop is a warp-wide argmax of the
// ordered float64 score key (two redux.sync on its halves), with the rank-path tie-break
// (a proper prefix first) resolved by walking the popped nodes' parents in shared memory.
// A candidate's successor scores (next sibling, first child) are computed when it is pushed,
// so a pop only moves values. Then the whole block writes every output (token ids, depths,
// parents, child links, ancestor visibility) with padding.
#include "ddtree_common.cuh"

namespace {

constexpr int kThreads = 128;
constexpr unsigned kFull = 0xffffffffu;

// Candidate descriptor: parent node (10 bits), rank (10), depth (6), pred node (10): pred is
// the popped node that pushed it (its previous sibling, or its parent for rank 0).
__device__ __forceinline__ uint64_t pack(int p, int r, int d, int pred) {
  return static_cast<uint64_t>(p) | (static_cast<uint64_t>(r) << 10) |
         (static_cast<uint64_t>(d) << 20) | (static_cast<uint64_t>(pred) << 26);
}
__device__ __forceinline__ int info_p(uint64_t i) { return static_cast<int>(i & 1023); }
__device__ __forceinline__ int info_r(uint64_t i) { return static_cast<int>((i >> 10) & 1023); }
__device__ __forceinline__ int info_d(uint64_t i) { return static_cast<int>((i >> 20) & 63); }
__device__ __forceinline__ int info_pred(uint64_t i) { return static_cast<int>((i >> 26) & 1023); }

// Rank path of candidate a < rank path of candidate b (Python tuple order: a proper prefix
// first). Candidates are (parent node, rank, depth); lifting walks the popped nodes.
__device__ __noinline__ bool path_less(uint64_t a, uint64_t b, const int16_t* parent,
                                       const int16_t* rank) {
  int pa = info_p(a), ra = info_r(a), da = info_d(a);
  int pb = info_p(b), rb = info_r(b), db = info_d(b);
  if (da > db) {
    while (da > db) { ra = rank[pa]; pa = parent[pa]; --da; }
    if (pa == pb && ra == rb) return false;  // b is a prefix of a
  } else if (db > da) {
    while (db > da) { rb = rank[pb]; pb = parent[pb]; --db; }
    if (pa == pb && ra == rb) return true;  // a is a prefix of b
  } else if (pa == pb && ra == rb) {
    return false;
  }
  while (pa != pb) {
    ra = rank[pa]; pa = parent[pa];
    rb = rank[pb]; pb = parent[pb];
  }
  return ra < rb;
}

struct Smem {
  float* lp;        // [H*K]
  int16_t* parent;  // [n1] per popped node
  int16_t* rank;
  int16_t* depth;
  int16_t* pred;
  int16_t* fc;  // first child
  int16_t* ns;  // next sibling
  uint32_t* bits;  // [n1 * W] visibility bitsets
  int* count;
};

__host__ __device__ inline size_t align16(size_t x) { return (x + 15) & ~size_t(15); }

__host__ __device__ inline size_t smem_bytes(int H, int K, int budget) {
  const size_t n1 = budget + 1, W = (n1 + 31) / 32;
  return align16(size_t(H) * K * 4) + 6 * align16(n1 * 2) + align16(n1 * W * 4) + 16;
}

__device__ inline Smem carve(char* base, int H, int K, int budget) {
  const size_t n1 = budget + 1;
  Smem s;
  s.lp = reinterpret_cast<float*>(base);
  base += align16(size_t(H) * K * 4);
  int16_t** arrs[6] = {&s.parent, &s.rank, &s.depth, &s.pred, &s.fc, &s.ns};
  for (int i = 0; i < 6; ++i) {
    *arrs[i] = reinterpret_cast<int16_t*>(base);
    base += align16(n1 * 2);
  }
  s.bits = reinterpret_cast<uint32_t*>(base);
  base += align16(n1 * ((n1 + 31) / 32) * 4);
  s.count = reinterpret_cast<int*>(base);
  return s;
}

// Best-first loop of warp 0; returns the number of popped nodes (lane 0 stores it).
template <int S>
__device__ void pop_loop(const Smem& sm, int H, int K, int budget) {
  const int lane = threadIdx.x & 31;
  const float* lp = sm.lp;
  uint64_t key[S], info[S];
  double sib[S], chd[S];
#pragma unroll
  for (int t = 0; t < S; ++t) { key[t] = 0; info[t] = 0; sib[t] = 0.0; chd[t] = 0.0; }
  if (lane == 0) {
    const double s0 = static_cast<double>(lp[0]);
    key[0] = ddtree::double_key(s0);
    info[0] = pack(0, 0, 1, 0);
    if (K > 1) sib[0] = s0 - static_cast<double>(lp[0]) + static_cast<double>(lp[1]);
    if (H > 1) chd[0] = s0 + static_cast<double>(lp[K]);
  }
  if (lane == 0) { sm.parent[0] = -1; sm.rank[0] = 0; sm.depth[0] = 0; sm.pred[0] = -1; }
  __syncwarp();
  int n = 0, F = 1;
  while (n < budget) {
    // Lane-local best (ties by rank path).
    uint64_t bk = key[0], bi = info[0];
    int bt = 0;
#pragma unroll
    for (int t = 1; t < S; ++t) {
      if (key[t] > bk || (key[t] == bk && bk != 0 && path_less(info[t], bi, sm.parent, sm.rank))) {
        bk = key[t]; bi = info[t]; bt = t;
      }
    }
    // Warp-wide argmax of the 64-bit key.
    const uint32_t hi = static_cast<uint32_t>(bk >> 32), lo = static_cast<uint32_t>(bk);
    const uint32_t mh = __reduce_max_sync(kFull, hi);
    const uint32_t ml = __reduce_max_sync(kFull, hi == mh ? lo : 0u);
    if (mh == 0 && ml == 0) break;  // frontier empty
    const uint32_t tied = __ballot_sync(kFull, hi == mh && lo == ml);
    int w = __ffs(tied) - 1;
    uint64_t wi = __shfl_sync(kFull, bi, w);
    if (tied & (tied - 1)) {
      uint32_t rest = tied & (tied - 1);
      while (rest) {
        const int l = __ffs(rest) - 1;
        rest &= rest - 1;
        const uint64_t li = __shfl_sync(kFull, bi, l);
        if (path_less(li, wi, sm.parent, sm.rank)) { w = l; wi = li; }
      }
    }
    double my_sib = sib[0], my_chd = chd[0];
#pragma unroll
    for (int t = 1; t < S; ++t) {
      if (t == bt) { my_sib = sib[t]; my_chd = chd[t]; }
    }
    const double wsib = __shfl_sync(kFull, my_sib, w);
    const double wchd = __shfl_sync(kFull, my_chd, w);
    const int wt = __shfl_sync(kFull, bt, w);
    const int p = info_p(wi), r = info_r(wi), d = info_d(wi);
    ++n;
    if (lane == 0) {
      sm.parent[n] = static_cast<int16_t>(p);
      sm.rank[n] = static_cast<int16_t>(r);
      sm.depth[n] = static_cast<int16_t>(d);
      sm.pred[n] = static_cast<int16_t>(info_pred(wi));
    }
    if (n == budget) break;
    const bool has_sib = r + 1 < K, has_chd = d < H;
    // New candidates and their successors' scores (float64, in the reference's order).
    const float* row = lp + (d - 1) * K;
    uint64_t sk = 0, si = 0, ck = 0, ci = 0;
    double ss = 0.0, sc = 0.0, cs = 0.0, cc = 0.0;
    if (has_sib) {
      sk = ddtree::double_key(wsib);
      si = pack(p, r + 1, d, n);
      if (r + 2 < K) ss = wsib - static_cast<double>(row[r + 1]) + static_cast<double>(row[r + 2]);
      if (d < H) sc = wsib + static_cast<double>(lp[d * K]);
    }
    if (has_chd) {
      ck = ddtree::double_key(wchd);
      ci = pack(n, 0, d + 1, n);
      if (K > 1) cs = wchd - static_cast<double>(lp[d * K]) + static_cast<double>(lp[d * K + 1]);
      if (d + 1 < H) cc = wchd + static_cast<double>(lp[(d + 1) * K]);
    }
    // Winner slot takes the sibling (else the child, else empties); a second push appends.
    const bool both = has_sib && has_chd;
    const int cl = F & 31, ct = F >> 5;
    if (both) ++F;
#pragma unroll
    for (int t = 0; t < S; ++t) {
      if (lane == w && t == wt) {
        if (has_sib) { key[t] = sk; info[t] = si; sib[t] = ss; chd[t] = sc; }
        else if (has_chd) { key[t] = ck; info[t] = ci; sib[t] = cs; chd[t] = cc; }
        else { key[t] = 0; }
      }
      if (both && lane == cl && t == ct) { key[t] = ck; info[t] = ci; sib[t] = cs; chd[t] = cc; }
    }
    __syncwarp();
  }
  if (lane == 0) *sm.count = n;
}

template <int S>
__global__ void __launch_bounds__(kThreads) build_trees_kernel(
    const float* __restrict__ top_lp, const int64_t* __restrict__ top_ids, int H, int K,
    int budget, int64_t* __restrict__ token_ids, int64_t* __restrict__ depths,
    int64_t* __restrict__ parents, uint8_t* __restrict__ visibility,
    int64_t* __restrict__ first_child, int64_t* __restrict__ next_sibling,
    int64_t* __restrict__ num_nodes) {
  extern __shared__ __align__(16) char smem_raw[];
  const int b = blockIdx.x, tid = threadIdx.x;
  const Smem sm = carve(smem_raw, H, K, budget);
  const int HK = H * K, n1 = budget + 1, W = (n1 + 31) / 32;
  const float* lp_g = top_lp + static_cast<int64_t>(b) * HK;
  for (int i = tid; i < HK; i += kThreads) sm.lp[i] = lp_g[i];
  if (tid == 0) *sm.count = 0;
  __syncthreads();
  if (budget > 0 && H > 0 && K > 0 && tid < 32) pop_loop<S>(sm, H, K, budget);
  if (tid == 0) { sm.parent[0] = -1; sm.depth[0] = 0; }
  __syncthreads();
  const int n = *sm.count;
  for (int i = tid; i < n1; i += kThreads) { sm.fc[i] = -1; sm.ns[i] = -1; }
  __syncthreads();
  for (int i = 1 + tid; i <= n; i += kThreads) {
    if (sm.rank[i] == 0) sm.fc[sm.parent[i]] = static_cast<int16_t>(i);
    else sm.ns[sm.pred[i]] = static_cast<int16_t>(i);
  }
  for (int i = tid; i <= n; i += kThreads) {
    uint32_t* rowbits = sm.bits + i * W;
    for (int w = 0; w < W; ++w) rowbits[w] = 0u;
    int x = i;
    while (true) {
      rowbits[x >> 5] |= 1u << (x & 31);
      if (x == 0) break;
      x = sm.parent[x];
    }
  }
  __syncthreads();
  const int64_t ob = static_cast<int64_t>(b);
  const int64_t* ids_g = top_ids + ob * HK;
  for (int i = tid; i < budget; i += kThreads) {
    int64_t tok = -1, dep = -1;
    if (i < n) {
      const int d = sm.depth[i + 1];
      tok = ids_g[(d - 1) * K + sm.rank[i + 1]];
      dep = d;
    }
    token_ids[ob * budget + i] = tok;
    depths[ob * budget + i] = dep;
  }
  for (int i = tid; i < n1; i += kThreads) {
    const bool live = i <= n;
    parents[ob * n1 + i] = (live && i > 0) ? sm.parent[i] : -1;
    first_child[ob * n1 + i] = live ? sm.fc[i] : -1;
    next_sibling[ob * n1 + i] = live ? sm.ns[i] : -1;
  }
  if (tid == 0) num_nodes[b] = n;
  // Visibility: one warp per row, lanes over columns.
  uint8_t* vis = visibility + ob * n1 * n1;
  const int lane = tid & 31, warp = tid >> 5;
  for (int i = warp; i < n1; i += kThreads / 32) {
    const uint32_t* rowbits = sm.bits + i * W;
    for (int j = lane; j < n1; j += 32) {
      uint8_t v = 0;
      if (i <= n && j <= n) v = static_cast<uint8_t>((rowbits[j >> 5] >> (j & 31)) & 1u);
      vis[static_cast<int64_t>(i) * n1 + j] = v;
    }
  }
}

template <int S>
cudaError_t launch(const float* lp, const int64_t* ids, int B, int H, int K, int budget,
                   int64_t* tok, int64_t* dep, int64_t* par, uint8_t* vis, int64_t* fc,
                   int64_t* ns, int64_t* nn, cudaStream_t stream) {
  const size_t smem = smem_bytes(H, K, budget);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(build_trees_kernel<S>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  build_trees_kernel<S><<<B, kThreads, smem, stream>>>(lp, ids, H, K, budget, tok, dep, par, vis,
                                                      fc, ns, nn);
  return cudaGetLastError();
}

}  // namespace

extern "C" int ddtree_build_trees(const float* top_log_probs, const int64_t* top_token_ids,
                                  int batch, int depth, int k, int budget, int64_t* token_ids,
                                  int64_t* depths, int64_t* parents, uint8_t* visibility,
                                  int64_t* first_child, int64_t* next_sibling,
                                  int64_t* num_nodes, cudaStream_t stream) {
  if (batch < 0 || batch > 65535 || depth < 0 || depth > DDTREE_MAX_DEPTH || k < 0 ||
      k > DDTREE_MAX_K || budget < 0 || budget > DDTREE_MAX_BUDGET)
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if ((depth * k > 0 && (!top_log_probs || !top_token_ids)) || !parents || !visibility ||
      !first_child || !next_sibling || !num_nodes || (budget > 0 && (!token_ids || !depths)))
    return cudaErrorInvalidValue;
  const int slots = (budget + 31) / 32;
  if (slots <= 1)
    return launch<1>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                     parents, visibility, first_child, next_sibling, num_nodes, stream);
  if (slots <= 2)
    return launch<2>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                     parents, visibility, first_child, next_sibling, num_nodes, stream);
  if (slots <= 4)
    return launch<4>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                     parents, visibility, first_child, next_sibling, num_nodes, stream);
  if (slots <= 8)
    return launch<8>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                     parents, visibility, first_child, next_sibling, num_nodes, stream);
  return launch<16>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                    parents, visibility, first_child, next_sibling, num_nodes, stream);
}
