// tree_build.cu: batched best-first DDTree build on the GPU, tie-exact with
// liranringel/ddtree build_ddtree_tree (see kernels/reference.py for the contract).
//
// One block per request; three ways to the same pop order, chosen by the algo argument
// (DDTREE_TREE_* in ddtree_kernels.h):
//  * levels (level_select in tree_build_levels.cuh, inside the heap kernel; budgets <= 64):
//    when every score is an exact float64 sum, the pop order is the score order, and the block
//    selects the best `budget` nodes level by level. auto hands anything else (ties, inexact
//    sums, very wide levels) to the heap loop in the same launch; DDTREE_TREE_LEVELS alone
//    (tests) reports num_nodes = -1 instead.
//  * heap (budgets above 64, and the levels path's fallback; kernel build_trees_heap_kernel,
//    loop pop_loop_heap): warp 0 pops with only the frontier keys in registers and the
//    candidate records in shared memory; one redux.sync per pop in the common case (see
//    pop_loop_heap). The other warps stage the token ids meanwhile (with levels on, the
//    prologue already did); the epilogue reads the packed node records.
//  * heap_lowmem (where the heap kernel's 24 bytes of shared memory per top-K entry do not
//    fit; build_trees_lowmem_kernel, loop pop_loop_lowmem): warp 0 runs the best-first loop
//    with the frontier (at most `budget` candidates) in registers, S slots per lane; each pop
//    is a warp-wide argmax of the ordered float64 score key (two redux.sync on its halves),
//    the rank-path tie-break (a proper prefix first) resolved by walking the popped nodes'
//    parents in shared memory.
// Then the whole block writes every output (token ids, depths, parents, child links, ancestor
// visibility) with padding. Retired variants (a two-pops-per-vote loop, a parallel
// delta-stepping selection; both slower on an H200) are in benchmarks/NOTES-kernels-i.md and
// git history.
#include "ddtree_common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

// Candidate descriptor: parent node or entry (16 bits), rank (11), depth (6), pred (16): pred
// is the popped node that pushed it (its previous sibling, or its parent for rank 0).
__device__ __forceinline__ uint64_t pack(int p, int r, int d, int pred) {
  return static_cast<uint64_t>(p & 0xffff) | (static_cast<uint64_t>(r) << 16) |
         (static_cast<uint64_t>(d) << 27) | (static_cast<uint64_t>(pred & 0xffff) << 33);
}
__device__ __forceinline__ int info_p(uint64_t i) { return static_cast<int>(i & 0xffff); }
__device__ __forceinline__ int info_r(uint64_t i) { return static_cast<int>((i >> 16) & 2047); }
__device__ __forceinline__ int info_d(uint64_t i) { return static_cast<int>((i >> 27) & 63); }
__device__ __forceinline__ int info_pred(uint64_t i) {
  return static_cast<int>((i >> 33) & 0xffff);
}

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
  int64_t* ids;  // heap: [H*K] token ids, staged by warps 1.. during the loop; else null
  double* lpd;   // heap: [2 H*K + 1] float64: log-probs, 0.0, negated log-probs; else null
  uint64_t* rinfo;  // heap: per frontier slot [32 * S]: candidate (pack())
  uint64_t* rskey;  // heap: key of the candidate's next sibling (0: none)
  uint64_t* rckey;  // heap: key of the candidate's first child (0: none)
  uint64_t* ninfo;  // heap: [budget + 1] popped node n: its candidate (pack())
};

// heap frontier slots: 32 lanes x S, S = ceil(budget / 32) (at least 1).
__host__ __device__ inline size_t heap_slots(int budget) {
  return size_t(budget > 32 ? (budget + 31) / 32 : 1) * 32;
}

__host__ __device__ inline size_t align16(size_t x) { return (x + 15) & ~size_t(15); }

__host__ __device__ inline size_t smem_bytes(int H, int K, int budget, bool heap) {
  const size_t n1 = budget + 1, W = (n1 + 31) / 32;
  return align16(size_t(H) * K * 4) + 6 * align16(n1 * 2) + align16(n1 * W * 4) + 16 +
         (heap ? size_t(H) * K * 8 + align16((2 * size_t(H) * K + 1) * 8) +
                   3 * heap_slots(budget) * 8 + align16((size_t(budget) + 1) * 8)
             : 0);
}

__device__ inline Smem carve(char* base, int H, int K, int budget, bool heap) {
  char* const start = base;
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
  base += 16;
  s.ids = nullptr;
  s.lpd = nullptr;
  if (heap) {
    s.ids = reinterpret_cast<int64_t*>(start + smem_bytes(H, K, budget, false));
    s.lpd = reinterpret_cast<double*>(s.ids + size_t(H) * K);
    s.rinfo = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(s.lpd) +
                                          align16((2 * size_t(H) * K + 1) * 8));
    s.rskey = s.rinfo + heap_slots(budget);
    s.rckey = s.rskey + heap_slots(budget);
    s.ninfo = s.rckey + heap_slots(budget);
  }
  return s;
}

// Best-first loop of warp 0; returns the number of popped nodes (lane 0 stores it).
template <int S>
__device__ void pop_loop_lowmem(const Smem& sm, int H, int K, int budget) {
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

#include "tree_build_heap.cuh"    // pop_loop_heap
#include "tree_build_levels.cuh"  // level_select (auto's first try for budget <= 64)

template <int S>
__global__ void __launch_bounds__(kThreads) build_trees_lowmem_kernel(
    const float* __restrict__ top_lp, const int64_t* __restrict__ top_ids, int H, int K,
    int budget, int64_t* __restrict__ token_ids, int64_t* __restrict__ depths,
    int64_t* __restrict__ parents, uint8_t* __restrict__ visibility,
    int64_t* __restrict__ first_child, int64_t* __restrict__ next_sibling,
    int64_t* __restrict__ num_nodes) {
  extern __shared__ __align__(16) char smem_raw[];
  const int b = blockIdx.x, tid = threadIdx.x;
  const Smem sm = carve(smem_raw, H, K, budget, false);
  const int HK = H * K, n1 = budget + 1, W = (n1 + 31) / 32;
  const float* lp_g = top_lp + static_cast<int64_t>(b) * HK;
  for (int i = tid; i < HK; i += kThreads) sm.lp[i] = lp_g[i];
  if (tid == 0) *sm.count = 0;
  __syncthreads();
  const bool work = budget > 0 && H > 0 && K > 0;
  __syncthreads();
  if (work && tid < 32) pop_loop_lowmem<S>(sm, H, K, budget);
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

// The heap kernel: same outputs, pop_loop_heap, and an epilogue that reads the packed node
// records directly (links, ancestor bits in registers, token ids staged in shared memory by
// the idle warps during the loop).
// levels: 0 = the pop loop only, 1 = level_select (tree_build_levels.cuh) with the pop loop as
// its fallback, 2 = level_select only (tests: num_nodes = -1 where it declines the input).
template <int S>
__global__ void __launch_bounds__(kThreads, 1) build_trees_heap_kernel(
    const float* __restrict__ top_lp, const int64_t* __restrict__ top_ids, int H, int K,
    int budget, int64_t* __restrict__ token_ids, int64_t* __restrict__ depths,
    int64_t* __restrict__ parents, uint8_t* __restrict__ visibility,
    int64_t* __restrict__ first_child, int64_t* __restrict__ next_sibling,
    int64_t* __restrict__ num_nodes, int levels) {
  extern __shared__ __align__(16) char smem_raw[];
  const int b = blockIdx.x, tid = threadIdx.x;
  const Smem sm = carve(smem_raw, H, K, budget, true);
  const int HK = H * K, n1 = budget + 1, W = (n1 + 31) / 32;
  const int64_t ob = static_cast<int64_t>(b);
  const float* lp_g = top_lp + ob * HK;
  const int64_t* ids_g = top_ids + ob * HK;
  const bool work = budget > 0 && H > 0 && K > 0;
  constexpr bool kLevels = S == 1 || S == 2;  // budget <= 64
  const bool lv_on = kLevels && levels > 0 && work && budget <= kLvMaxBudget;
  LvSmem* lvp = nullptr;
  if constexpr (kLevels) {
    __shared__ LvSmem lv;
    lvp = &lv;
  }
  bool lv_ok = lv_on;
  // Budgets <= 64 stage the visibility matrix as bytes in shared memory (zeroed here, each row
  // written by its node's thread) at the output's 16-byte phase, and copy it out with 16-byte
  // stores; larger budgets build bit rows and store bytes.
  uint8_t* const vis_g = visibility + ob * n1 * n1;
  const int vis_a = static_cast<int>(reinterpret_cast<uintptr_t>(vis_g) & 15u);
  uint8_t* stage = nullptr;
  if constexpr (kLevels) {
    uint4* z = reinterpret_cast<uint4*>(lvp->vis);
    for (int i = tid; i < kLvVisBytes / 16; i += kThreads) z[i] = make_uint4(0u, 0u, 0u, 0u);
    stage = lvp->vis + vis_a;
  }
  if (lv_on) {
    // The level path needs every warp: stage the ids now, beside the log-probs, and check its
    // preconditions on the values as they arrive (lv_check).
    for (int i = tid; i < n1; i += kThreads) { sm.fc[i] = -1; sm.ns[i] = -1; }
    const int kc = min(K, budget), kx = min(K, kc + 1);
    int emin = 1000;
    float amax = 0.0f;
    for (int i0 = tid; i0 < HK; i0 += 4 * kThreads) {  // four of each load in flight
      float v[4], prev[4];
      int64_t t[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = i0 + q * kThreads;
        if (i < HK) {
          v[q] = lp_g[i];
          prev[q] = lp_g[i > 0 ? i - 1 : 0];
          t[q] = ids_g[i];
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = i0 + q * kThreads;
        if (i < HK) {
          const int d = i / K, r = i - d * K;
          sm.lpd[i] = v[q];
          sm.lpd[HK + 1 + i] = -static_cast<double>(v[q]);
          sm.ids[i] = t[q];
          if (r < kx) lv_check(v[q], prev[q], d, r, kc, lv_ok, emin, amax);
        }
      }
    }
    emin = __reduce_min_sync(kFull, emin);
    const uint32_t ab = __reduce_max_sync(kFull, __float_as_uint(amax));
    if ((tid & 31) == 0) { lvp->wemin[tid >> 5] = emin; lvp->wamax[tid >> 5] = ab; }
  } else {
    for (int i = tid; i < HK; i += kThreads) {
      const double v = static_cast<double>(lp_g[i]);
      sm.lpd[i] = v;
      sm.lpd[HK + 1 + i] = -v;
    }
  }
  if (tid == 0) { sm.lpd[HK] = 0.0; *sm.count = 0; }
  lv_ok = __syncthreads_and(lv_ok);
  bool built = false;
  if constexpr (kLevels) {
    if (lv_on) {
      if (lv_ok && lv_eligible(*lvp, H))
        built = level_select(sm, *lvp, H, K, budget, stage, n1, levels == 2);
      if (!built && levels == 2) {  // tests: no fallback, say so
        if (tid == 0) num_nodes[b] = -1;
        return;
      }
    }
  }
  if (!built) {
    if (tid < 32) {
      if (work) pop_loop_heap<S>(sm, H, K, budget);
    } else if (!lv_on) {  // the other warps meanwhile: token ids to shared memory, links to -1
      for (int i = tid - 32; i < HK; i += kThreads - 32) sm.ids[i] = ids_g[i];
      for (int i = tid - 32; i < n1; i += kThreads - 32) { sm.fc[i] = -1; sm.ns[i] = -1; }
    }
  }
  __syncthreads();
  const int n = *sm.count;
  if (!built) {  // (the level path wrote its own links and bits)
    // Links (children in pop order: rank 0 is the first child, else the previous sibling's
    // next) and ancestor bits of row i (at most S + 1 words, in registers).
    for (int i = 1 + tid; i <= n; i += kThreads) {
      const uint64_t x = sm.ninfo[i];
      if (info_r(x) == 0) sm.fc[info_p(x)] = static_cast<int16_t>(i);
      else sm.ns[info_pred(x)] = static_cast<int16_t>(i);
    }
    constexpr int MW = S + 1;
    if constexpr (kLevels) {  // visibility rows as staged bytes
      for (int i = tid; i <= n; i += kThreads) {
        uint8_t* row = stage + i * n1;
        for (int x = i;; x = info_p(sm.ninfo[x])) {
          row[x] = 1;
          if (x == 0) break;
        }
      }
    } else for (int i = tid; i <= n; i += kThreads) {
      uint32_t rb[MW];
#pragma unroll
      for (int w = 0; w < MW; ++w) rb[w] = 0u;
      int x = i;
      while (true) {
#pragma unroll
        for (int w = 0; w < MW; ++w) rb[w] |= (w == (x >> 5)) ? 1u << (x & 31) : 0u;
        if (x == 0) break;
        x = info_p(sm.ninfo[x]);
      }
      uint32_t* rowbits = sm.bits + i * W;
#pragma unroll
      for (int w = 0; w < MW; ++w)
        if (w < W) rowbits[w] = rb[w];
    }
    __syncthreads();
  }
  for (int i = tid; i < budget; i += kThreads) {
    int64_t tok = -1, dep = -1;
    if (i < n) {
      const uint64_t x = sm.ninfo[i + 1];
      dep = info_d(x);
      tok = sm.ids[(dep - 1) * K + info_r(x)];
    }
    token_ids[ob * budget + i] = tok;
    depths[ob * budget + i] = dep;
  }
  for (int i = tid; i < n1; i += kThreads) {
    const bool live = i <= n;
    parents[ob * n1 + i] = (live && i > 0) ? info_p(sm.ninfo[i]) : -1;
    first_child[ob * n1 + i] = live ? sm.fc[i] : -1;
    next_sibling[ob * n1 + i] = live ? sm.ns[i] : -1;
  }
  if (tid == 0) num_nodes[b] = n;
  if constexpr (kLevels) {
    // The staged matrix: byte k of chunk c is output byte 16c + k - vis_a; whole chunks go out
    // as one 16-byte store, the two partial ones byte by byte.
    uint8_t* const g0 = vis_g - vis_a;
    const int lo = vis_a, hi = vis_a + n1 * n1, chunks = (hi + 15) / 16;
    for (int c = tid; c < chunks; c += kThreads) {
      const uint4 v = reinterpret_cast<const uint4*>(lvp->vis)[c];
      if (16 * c >= lo && 16 * c + 16 <= hi) {
        *reinterpret_cast<uint4*>(g0 + 16 * c) = v;
      } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 16; ++k)
          if (16 * c + k >= lo && 16 * c + k < hi)
            g0[16 * c + k] = static_cast<uint8_t>(w[k >> 2] >> (8 * (k & 3)));
      }
    }
  } else {
    // Visibility, flat over the n1 x n1 bytes (coalesced; (row, column) stepped, not divided).
    // (Measured on an H200: 32-bit word stores, one division a word, were slower.)
    uint8_t* vis = vis_g;
    const int nn = n1 * n1, q = kThreads / n1, rem = kThreads - q * n1;
    int i = tid / n1, j = tid - i * n1;
#pragma unroll 4
    for (int f = tid; f < nn; f += kThreads) {
      uint8_t v = 0;
      if (i <= n && j <= n) v = static_cast<uint8_t>((sm.bits[i * W + (j >> 5)] >> (j & 31)) & 1u);
      vis[f] = v;
      i += q;
      j += rem;
      if (j >= n1) { j -= n1; ++i; }
    }
  }
}

template <int S>
cudaError_t launch_heap(const float* lp, const int64_t* ids, int B, int H, int K, int budget,
                        int64_t* tok, int64_t* dep, int64_t* par, uint8_t* vis, int64_t* fc,
                        int64_t* ns, int64_t* nn, size_t smem4, int levels,
                        cudaStream_t stream) {
  if (smem4 > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(build_trees_heap_kernel<S>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem4));
    if (e != cudaSuccess) return e;
  }
  build_trees_heap_kernel<S><<<B, kThreads, smem4, stream>>>(lp, ids, H, K, budget, tok, dep,
                                                             par, vis, fc, ns, nn, levels);
  return cudaGetLastError();
}

// algo (checked by the caller): auto = the heap kernel with the level selection first for
// budget <= 64 (the heap loop where it declines the input); levels = the level selection alone
// (tests: num_nodes = -1 where it declines); heap = the heap loop alone (H200: 21.1 / 22.1 us
// at B=64, H=15, K=8 / 64, budget 64); heap_lowmem = the low-memory kernel. The heap kernel
// keeps the token ids and float64 log-probs in shared memory (24 bytes per (H, K) entry); where
// that passes 160 KiB, auto, levels and heap take the low-memory kernel.
template <int S>
cudaError_t launch(const float* lp, const int64_t* ids, int B, int H, int K, int budget,
                   int64_t* tok, int64_t* dep, int64_t* par, uint8_t* vis, int64_t* fc,
                   int64_t* ns, int64_t* nn, int algo, cudaStream_t stream) {
  const size_t smem4 = smem_bytes(H, K, budget, true);
  if (algo != DDTREE_TREE_HEAP_LOWMEM && smem4 <= 160 * 1024) {
    const int levels = algo == DDTREE_TREE_AUTO ? 1 : algo == DDTREE_TREE_LEVELS ? 2 : 0;
    return launch_heap<S>(lp, ids, B, H, K, budget, tok, dep, par, vis, fc, ns, nn, smem4,
                          levels, stream);
  }
  const size_t smem = smem_bytes(H, K, budget, false);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(build_trees_lowmem_kernel<S>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  build_trees_lowmem_kernel<S><<<B, kThreads, smem, stream>>>(lp, ids, H, K, budget, tok, dep,
                                                              par, vis, fc, ns, nn);
  return cudaGetLastError();
}

}  // namespace

extern "C" int ddtree_build_trees(const float* top_log_probs, const int64_t* top_token_ids,
                                  int batch, int depth, int k, int budget, int64_t* token_ids,
                                  int64_t* depths, int64_t* parents, uint8_t* visibility,
                                  int64_t* first_child, int64_t* next_sibling,
                                  int64_t* num_nodes, int algo, cudaStream_t stream) {
  if (algo < DDTREE_TREE_AUTO || algo > DDTREE_TREE_HEAP_LOWMEM) return cudaErrorInvalidValue;
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
                     parents, visibility, first_child, next_sibling, num_nodes, algo, stream);
  if (slots <= 2)
    return launch<2>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                     parents, visibility, first_child, next_sibling, num_nodes, algo, stream);
  if (slots <= 4)
    return launch<4>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                     parents, visibility, first_child, next_sibling, num_nodes, algo, stream);
  if (slots <= 8)
    return launch<8>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                     parents, visibility, first_child, next_sibling, num_nodes, algo, stream);
  return launch<16>(top_log_probs, top_token_ids, batch, depth, k, budget, token_ids, depths,
                    parents, visibility, first_child, next_sibling, num_nodes, algo, stream);
}
