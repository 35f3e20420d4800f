// tree_build_levels.cuh: the level-synchronous tree build (v6, the default for budget <= 64).
// Included by tree_build.cu inside its anonymous namespace, after the Smem layout, pack() and
// the v4 loop (its fallback). Python model of the same decisions, checked against the
// reference on CPU: tests/tree_levels_model.py.
//
// Why it is exact. When every log-prob the reference reads is a float32 whose float64 partial
// sums along any path are exact (all are multiples of the smallest ulp 2^E among them, and H
// times the largest magnitude stays below 2^(53+E)), the reference's score chains
// `(s - a) + b` equal `s_parent + lp[d][r]` exactly. If moreover the rows are sorted (best
// first) and lp[d][0] <= 0 for d >= 1, a node never scores above the node that pushed it (its
// parent, or its previous sibling), and that node's rank path is a prefix or a smaller
// sibling, so it pops first. Then, without exact score ties among the selected nodes, the
// best-first pop order IS the selected nodes sorted by score: the top `budget` nodes of the
// whole candidate tree. The block finds them level by level:
//   T := the best `budget` nodes of depth <= d (sorted; depth 1: the first row),
//   children of T's depth-d nodes that can still enter T (score >= T's last score when T is
//   full; the j-th depth-d parent's child of rank r has (j+1)(r+2)-1 nodes ahead of it, so
//   r < budget/(j+1) - 1), ranked against T and each other by counting, T := the best budget,
// until no child qualifies. Any tie among the kept nodes (two share a rank) or a failed
// precondition returns false and the v4 loop builds the tree instead, bit-exact either way.
// Cost: 4 block barriers a level, levels = the tree's depth (2-3 for the benchmark's trees),
// instead of one dependent warp vote a node.
#pragma once

constexpr int kLvMaxBudget = 64;   // budgets above this take the v4 loop
constexpr int kLvCap = 224;  // candidates a level: the bound above gives at most 216, + 8 pad
constexpr uint32_t kLvRoot = 0xffu;

struct __align__(16) LvSmem {
  double tk[2][kLvMaxBudget];    // T's scores, sorted descending (double-buffered)
  uint32_t tm[2][kLvMaxBudget];  // T's records: parent slot in T (0xff: root) | rank << 8 |
                                 // depth << 16
  double ck[kLvCap];             // this level's candidates (16-byte aligned: 8-wide reads)
  uint32_t cm[kLvCap];
  int off[4];                     // [0]: candidates this level
  double ps[kLvMaxBudget];        // this level's parents in order: score, slot in T
  uint8_t pslot[kLvMaxBudget];
  int16_t newpos[kLvMaxBudget];  // T entry -> its slot in the next T (-1: dropped)
  int16_t own[kLvMaxBudget];     // slot -> the pool entry that took it (tie check)
  int16_t kid[(kLvMaxBudget + 1) * kLvMaxBudget];  // (parent node, rank) -> node
  int wemin[8];                  // per warp: smallest ulp exponent (lv_check)
  uint32_t wamax[8];             // per warp: largest magnitude, as float bits
};

__device__ __forceinline__ uint32_t lv_pack(uint32_t p, int r, int d) {
  return p | (static_cast<uint32_t>(r) << 8) | (static_cast<uint32_t>(d) << 16);
}

// The exact-sum preconditions on one log-prob the reference may read (row d, rank r; prev is
// the entry before it in its row): folded into the prologue's loads. ok: finite, rows sorted,
// lp[d][0] <= 0 below the root; emin: the smallest ulp exponent (2^emin) of a nonzero value;
// amax: the largest magnitude among ranks < kc. The block then checks
// H * amax < 2^(53 + emin), which bounds every partial sum along a path.
__device__ __forceinline__ void lv_check(float v, float prev, int d, int r, int kc, bool& ok,
                                         int& emin, float& amax) {
  const uint32_t bits = __float_as_uint(v);
  const uint32_t ex = (bits >> 23) & 0xffu;
  ok &= ex != 0xffu;
  if ((bits & 0x7fffffffu) != 0u) emin = min(emin, static_cast<int>(ex == 0u ? 1u : ex) - 150);
  if (r < kc) {
    amax = fmaxf(amax, fabsf(v));
    if (r > 0) ok &= v <= prev;
    else if (d > 0) ok &= v <= 0.0f;
  }
}

// Profiling hooks (benchmarks/tree_levels_profile.cu compiles with DDTREE_LV_PROFILE): thread 0
// of blocks < 64 adds the clock64 cycles of each phase to g_lv_prof[block][phase].
#ifdef DDTREE_LV_PROFILE
__device__ long long g_lv_prof[64][12];
__device__ unsigned long long g_lv_span[64][2];  // globaltimer (ns) at block start / end
__shared__ long long s_lv_prof[12];  // thread 0's accumulators, added to g_lv_prof at the end
#define LV_PROF(phase)                                                         \
  do {                                                                         \
    if (threadIdx.x == 0) {                                                    \
      const long long now_ = clock64();                                        \
      s_lv_prof[phase] += now_ - lv_t_;                                        \
      lv_t_ = now_;                                                            \
    }                                                                          \
  } while (0)
#else
#define LV_PROF(phase) \
  do {                 \
  } while (0)
#endif

// Builds the tree into sm.ninfo[1..n] / *sm.count like pop_loop_v4 and returns true, or
// returns false (nothing of the v4 loop's state touched) when the input is not eligible.
// The block's verdict on the preconditions from the warps' lv_check results (after a barrier).
__device__ __forceinline__ bool lv_eligible(const LvSmem& lv, int H) {
  int emin = 1000;
  uint32_t amax = 0u;
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    emin = min(emin, lv.wemin[w]);
    amax = max(amax, lv.wamax[w]);
  }
  return emin >= 1000 ||
         static_cast<double>(H) * static_cast<double>(__uint_as_float(amax)) <
             ldexp(1.0, 53 + emin);
}

__device__ bool level_select(const Smem& sm, LvSmem& lv, int H, int K, int budget) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const double* lp = sm.lpd;
  const int kc = min(K, budget);
#ifdef DDTREE_LV_PROFILE
  long long lv_t_ = clock64();
#endif
  // Depth 1: the first kc entries of row 0 (the root's children, already in order).
  for (int i = tid; i < kc; i += nt) {
    lv.tk[0][i] = lp[i];
    lv.tm[0][i] = lv_pack(kLvRoot, i, 1);
  }
  int cur = 0, n_t = kc;
  __syncthreads();
  for (int d = 1; d < H; ++d) {
    const double tau = n_t == budget ? lv.tk[cur][budget - 1] : -INFINITY;
    // A (warp 0): the children of T's depth-d entries (parent j = the j-th of them, T being
    // sorted) that can still enter T: ranks r with (j + 1)(r + 2) <= budget and a score >= tau.
    // Both hold on a prefix of each parent's ranks, and the count never grows with j. So the
    // parents go by in groups, W lanes each (W = the power of two >= the ranks the bound
    // leaves parent j: 64 for the first when K > 32, then 32, 16, ...); a ballot gives every
    // candidate its slot, and the walk stops after the first group with a parent without one.
    if (warp == 0) {
      const double* y = lp + d * K;
      const uint32_t u = static_cast<uint32_t>(d), lt = (1u << lane) - 1u;
      const bool a0 = lane < n_t && ((lv.tm[cur][lane] >> 16) & 0xffu) == u;
      const bool a1 = lane + 32 < n_t && ((lv.tm[cur][lane + 32] >> 16) & 0xffu) == u;
      const uint32_t m0 = __ballot_sync(kFull, a0), m1 = __ballot_sync(kFull, a1);
      if (a0) {
        const int j = __popc(m0 & lt);
        lv.ps[j] = lv.tk[cur][lane];
        lv.pslot[j] = static_cast<uint8_t>(lane);
      }
      if (a1) {
        const int j = __popc(m0) + __popc(m1 & lt);
        lv.ps[j] = lv.tk[cur][lane + 32];
        lv.pslot[j] = static_cast<uint8_t>(lane + 32);
      }
      const int n_par = __popc(m0) + __popc(m1);
      const double y0 = lane < kc ? y[lane] : 0.0, y1 = lane + 32 < kc ? y[lane + 32] : 0.0;
      __syncwarp();
      int off = 0, j = 0;
      while (j < n_par) {
        const int need = min(kc, budget / (j + 1) - 1);  // ranks the bound leaves parent j
        if (need <= 0) break;
        if (need > 32) {  // the first parent, K > 32: two ranks a lane
          const double s = lv.ps[j];
          const uint32_t slot = lv.pslot[j];
          const double k0 = s + y0, k1 = s + y1;
          const bool p0 = lane < kc && (lane + 2) * (j + 1) <= budget && k0 >= tau;
          const bool p1 = lane + 32 < kc && (lane + 34) * (j + 1) <= budget && k1 >= tau;
          const int c = __popc(__ballot_sync(kFull, p0)) + __popc(__ballot_sync(kFull, p1));
          if (c == 0) break;
          if (p0) { lv.ck[off + lane] = k0; lv.cm[off + lane] = lv_pack(slot, lane, d + 1); }
          if (p1) {
            lv.ck[off + 32 + lane] = k1;
            lv.cm[off + 32 + lane] = lv_pack(slot, lane + 32, d + 1);
          }
          off += c;
          ++j;
          continue;
        }
        const int sh = 32 - __clz(need - 1);  // W = 2^sh >= need
        const int jl = j + (lane >> sh), r = lane & ((1 << sh) - 1);
        const bool valid = jl < n_par;
        const double s = valid ? lv.ps[jl] : 0.0;
        const uint32_t slot = valid ? lv.pslot[jl] : 0u;
        const double key = s + (r < kc ? y[r] : 0.0);
        const bool pass = valid && r < kc && (r + 2) * (jl + 1) <= budget && key >= tau;
        const uint32_t bal = __ballot_sync(kFull, pass);
        const bool stop = __ballot_sync(kFull, valid && r == 0 && !pass) != 0u;
        if (pass) {
          const int q = off + __popc(bal & lt);
          lv.ck[q] = key;
          lv.cm[q] = lv_pack(slot, r, d + 1);
        }
        off += __popc(bal);
        j += 32 >> sh;
        if (stop) break;
      }
      if (lane < 8) lv.ck[off + lane] = -INFINITY;  // pads C's 8-wide reads
      if (lane == 0) lv.off[0] = off;
    }
    __syncthreads();
    LV_PROF(2);
    const int n_c = lv.off[0];
    if (n_c == 0) break;      // uniform: no child qualifies, T is final
    // C: rank of every pool entry (T then candidates) = entries scoring strictly higher: a
    // candidate's place in T by two rounds of eight independent loads, then a count over the
    // candidates, eight a step, split between two threads when the pool allows.
    const int nxt = cur ^ 1, n_p = n_t + n_c;
    const bool pair = n_p <= nt / 2;
    int myrank[2] = {-1, -1}, mye[2] = {-1, -1};
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int e = pair ? (v == 0 ? tid >> 1 : n_p) : tid + v * nt;
      const int half = pair ? tid & 1 : 0, step = pair ? 16 : 8;
      if (!pair && e >= n_p) break;
      const bool live = e < n_p, in_t = e < n_t;
      const double key = !live ? 0.0 : in_t ? lv.tk[cur][e] : lv.ck[e - n_t];
      int rank = e;
      if (live && !in_t) {
        int blk = 0;  // T entries 8q + 7 above key (T is sorted: a prefix)
#pragma unroll
        for (int q = 0; q < 8; ++q) blk += (8 * q + 7 < n_t && lv.tk[cur][8 * q + 7] > key);
        int in = 0;
#pragma unroll
        for (int q = 0; q < 7; ++q) {
          const int idx = 8 * blk + q;
          in += (idx < n_t && lv.tk[cur][idx] > key);
        }
        rank = 8 * blk + in;
      }
      int more = 0;  // candidates above key (the pad is -inf)
      const double2* ck2 = reinterpret_cast<const double2*>(lv.ck);
      if (live) {
        for (int f = 8 * half; f < n_c; f += step) {
          const double2 c0 = ck2[f / 2], c1 = ck2[f / 2 + 1], c2 = ck2[f / 2 + 2],
                        c3 = ck2[f / 2 + 3];
          more += (c0.x > key) + (c0.y > key) + (c1.x > key) + (c1.y > key) + (c2.x > key) +
                  (c2.y > key) + (c3.x > key) + (c3.y > key);
        }
      }
      if (pair) {
        more += __shfl_xor_sync(kFull, more, 1);
        if (half == 1 || !live) break;
      }
      rank += more;
      if (in_t) lv.newpos[e] = static_cast<int16_t>(rank < budget ? rank : -1);
      if (rank < budget) {
        lv.tk[nxt][rank] = key;
        lv.tm[nxt][rank] = in_t ? lv.tm[cur][e] : lv.cm[e - n_t];
        lv.own[rank] = static_cast<int16_t>(e);
      }
      myrank[v] = rank;
      mye[v] = e;
      if (pair) break;
    }
    __syncthreads();
    LV_PROF(4);
    // D: two entries on one rank are a tie (leave the tree to v4); parents move to their new
    // slots.
    bool bad = false;
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int r = myrank[v];
      if (r >= 0 && r < budget && lv.own[r] != mye[v]) bad = true;
    }
    const int n_next = min(budget, n_p);
    for (int z = tid; z < n_next; z += nt) {
      const uint32_t m = lv.tm[nxt][z];
      const uint32_t p = m & 0xffu;
      if (p != kLvRoot) {
        const int np = lv.newpos[p];
        if (np < 0) bad = true;
        else lv.tm[nxt][z] = (m & ~0xffu) | static_cast<uint32_t>(np);
      }
    }
    if (__syncthreads_or(bad)) return false;
    LV_PROF(5);
#ifdef DDTREE_LV_PROFILE
    if (tid == 0) s_lv_prof[9] += 1;  // levels
#endif
    cur = nxt;
    n_t = n_next;
  }
  // T in order is the pop order: node x + 1. Records as pop_loop_v4 writes them, with the
  // previous sibling (rank r - 1 under the same parent, always in T) as the pusher.
  for (int z = tid; z < n_t; z += nt) {
    const uint32_t m = lv.tm[cur][z];
    const uint32_t p = m & 0xffu;
    const int pnode = p == kLvRoot ? 0 : static_cast<int>(p) + 1;
    lv.kid[pnode * kLvMaxBudget + ((m >> 8) & 0xffu)] = static_cast<int16_t>(z + 1);
  }
  __syncthreads();
  for (int z = tid; z < n_t; z += nt) {
    const uint32_t m = lv.tm[cur][z];
    const uint32_t p = m & 0xffu;
    const int pnode = p == kLvRoot ? 0 : static_cast<int>(p) + 1;
    const int r = static_cast<int>((m >> 8) & 0xffu), d = static_cast<int>((m >> 16) & 0xffu);
    const int pred = r == 0 ? pnode : lv.kid[pnode * kLvMaxBudget + r - 1];
    sm.ninfo[z + 1] = pack(pnode, r, d, pred);
  }
  if (tid == 0) *sm.count = n_t;
  LV_PROF(6);
  return true;
}
