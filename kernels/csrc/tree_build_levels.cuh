// tree_build_levels.cuh: the level-synchronous tree build (v6, the default for budget <= 64).
// Included by tree_build.cu inside its anonymous namespace, after the Smem layout, pack() and
// the v4 loop (its fallback). Python model of the same decisions, checked against the
// reference on CPU: tests/tree_levels_model.py.
//
// Why it is exact. When every log-prob the reference reads is a float32 whose float64 partial
// sums along any path are exact (all are multiples of the smallest ulp 2^E among them, and the
// sum of the rows' largest magnitudes stays below 2^(53+E)), the reference's score chains
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
constexpr int kLvCap = 256;        // candidates a level; the bound above gives at most 216
constexpr uint32_t kLvRoot = 0xffu;

struct LvSmem {
  double tk[2][kLvMaxBudget];    // T's scores, sorted descending (double-buffered)
  uint32_t tm[2][kLvMaxBudget];  // T's records: parent slot in T (0xff: root) | rank << 8 |
                                 // depth << 16
  double ck[kLvCap];             // this level's candidates
  uint32_t cm[kLvCap];
  int off[kLvMaxBudget + 1];     // candidates of T entry i start at off[i]
  int16_t newpos[kLvMaxBudget];  // T entry -> its slot in the next T (-1: dropped)
  int16_t own[kLvMaxBudget];     // slot -> the pool entry that took it (tie check)
  int16_t kid[(kLvMaxBudget + 1) * kLvMaxBudget];  // (parent node, rank) -> node
  double mx;                     // sum of the rows' largest magnitudes
  int emin;                      // smallest ulp exponent among the log-probs read
  int total;                     // candidates this level
};

__device__ __forceinline__ uint32_t lv_pack(uint32_t p, int r, int d) {
  return p | (static_cast<uint32_t>(r) << 8) | (static_cast<uint32_t>(d) << 16);
}

// Whether the exact-sum preconditions hold (all threads of the block call it; uniform).
__device__ bool lv_eligible(const double* lp, LvSmem& lv, int H, int K, int kc) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int kx = min(K, kc + 1);  // the reference may read one column past the last pop
  bool ok = true;
  int emin = 1000;
  for (int i = tid; i < H * kx; i += nt) {
    const int d = i / kx, r = i - d * kx;
    const double v = lp[d * K + r];
    const uint32_t bits = __float_as_uint(static_cast<float>(v));
    const uint32_t ex = (bits >> 23) & 0xffu;
    ok &= ex != 0xffu;  // finite
    if ((bits & 0x7fffffffu) != 0u) emin = min(emin, static_cast<int>(ex == 0u ? 1u : ex) - 150);
    if (r < kc) {
      if (r > 0) ok &= v <= lp[d * K + r - 1];
      else if (d > 0) ok &= v <= 0.0;
    }
  }
  if (emin < 1000) atomicMin(&lv.emin, emin);
  if (tid < 32) {  // H <= 32: lane d sums row d's largest magnitude (rows are sorted if ok)
    double m = 0.0;
    if (tid < H) m = fmax(fabs(lp[tid * K]), fabs(lp[tid * K + kc - 1]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(kFull, m, o);
    if (tid == 0) lv.mx = m;
  }
  ok = __syncthreads_and(ok);
  return ok && (lv.emin >= 1000 || lv.mx < ldexp(1.0, 53 + lv.emin));
}

// Builds the tree into sm.ninfo[1..n] / *sm.count like pop_loop_v4 and returns true, or
// returns false (nothing of the v4 loop's state touched) when the input is not eligible.
__device__ bool level_select(const Smem& sm, LvSmem& lv, int H, int K, int budget) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const double* lp = sm.lpd;
  const int kc = min(K, budget);
  if (!lv_eligible(lp, lv, H, K, kc)) return false;
  // Depth 1: the first kc entries of row 0 (the root's children, already in order).
  for (int i = tid; i < kc; i += nt) {
    lv.tk[0][i] = lp[i];
    lv.tm[0][i] = lv_pack(kLvRoot, i, 1);
  }
  int cur = 0, n_t = kc;
  __syncthreads();
  for (int d = 1; d < H; ++d) {
    const double tau = n_t == budget ? lv.tk[cur][budget - 1] : -INFINITY;
    const double* y = lp + d * K;
    if (warp == 0) {  // candidates per depth-d entry of T and their offsets
      const int a = 2 * lane, b = a + 1;
      const bool pa = a < n_t && ((lv.tm[cur][a] >> 16) & 0xffu) == static_cast<uint32_t>(d);
      const bool pb = b < n_t && ((lv.tm[cur][b] >> 16) & 0xffu) == static_cast<uint32_t>(d);
      const uint32_t lt = (1u << lane) - 1u;
      const int ja = __popc(__ballot_sync(kFull, pa) & lt) + __popc(__ballot_sync(kFull, pb) & lt);
      const int jb = ja + (pa ? 1 : 0);
      int c[2] = {0, 0};
      const bool pe[2] = {pa, pb};
      const int je[2] = {ja, jb}, ie[2] = {a, b};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (!pe[e]) continue;
        const double s = lv.tk[cur][ie[e]];
        int lo = 0, hi = max(0, min(kc, budget / (je[e] + 1) - 1));
        while (lo < hi) {  // first rank whose score falls below tau
          const int mid = (lo + hi) >> 1;
          if (s + y[mid] >= tau) lo = mid + 1;
          else hi = mid;
        }
        c[e] = lo;
      }
      int x = c[0] + c[1];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(kFull, x, o);
        if (lane >= o) x += v;
      }
      const int ex = x - c[0] - c[1];
      lv.off[a] = ex;
      lv.off[b] = ex + c[0];
      if (lane == 31) { lv.off[kLvMaxBudget] = x; lv.total = x; }
    }
    __syncthreads();
    const int n_c = lv.total;
    if (n_c == 0) break;
    if (n_c > kLvCap) return false;  // cannot happen (bound 216); stay exact regardless
    for (int q = tid; q < n_c; q += nt) {  // write the candidates
      int lo = 0, hi = kLvMaxBudget;  // last entry i with off[i] <= q
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (lv.off[mid] <= q) lo = mid;
        else hi = mid;
      }
      const int r = q - lv.off[lo];
      lv.ck[q] = lv.tk[cur][lo] + y[r];
      lv.cm[q] = lv_pack(static_cast<uint32_t>(lo), r, d + 1);
    }
    __syncthreads();
    // Rank of every pool entry (T then candidates) = entries scoring strictly higher.
    const int nxt = cur ^ 1, n_p = n_t + n_c;
    int myrank[2] = {-1, -1};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = tid + u * nt;
      if (e >= n_p) break;
      const bool in_t = e < n_t;
      const double key = in_t ? lv.tk[cur][e] : lv.ck[e - n_t];
      int rank = e;
      if (!in_t) {
        int lo = 0, hi = n_t;
        while (lo < hi) {
          const int mid = (lo + hi) >> 1;
          if (lv.tk[cur][mid] > key) lo = mid + 1;
          else hi = mid;
        }
        rank = lo;
      }
      int more = 0;
#pragma unroll 4
      for (int f = 0; f < n_c; ++f) more += lv.ck[f] > key ? 1 : 0;
      rank += more;
      if (in_t) lv.newpos[e] = static_cast<int16_t>(rank < budget ? rank : -1);
      if (rank < budget) {
        lv.tk[nxt][rank] = key;
        lv.tm[nxt][rank] = in_t ? lv.tm[cur][e] : lv.cm[e - n_t];
        lv.own[rank] = static_cast<int16_t>(e);
      }
      myrank[u] = rank;
    }
    __syncthreads();
    bool bad = false;
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // two entries on one rank: a tie, leave it to v4
      const int r = myrank[u];
      if (r >= 0 && r < budget && lv.own[r] != tid + u * nt) bad = true;
    }
    const int n_next = min(budget, n_p);
    for (int x = tid; x < n_next; x += nt) {  // parents: old T slots -> new T slots
      const uint32_t m = lv.tm[nxt][x];
      const uint32_t p = m & 0xffu;
      if (p != kLvRoot) {
        const int np = lv.newpos[p];
        if (np < 0) bad = true;
        else lv.tm[nxt][x] = (m & ~0xffu) | static_cast<uint32_t>(np);
      }
    }
    if (__syncthreads_or(bad)) return false;
    cur = nxt;
    n_t = n_next;
  }
  // T in order is the pop order: node x + 1. Records as pop_loop_v4 writes them, with the
  // previous sibling (rank r - 1 under the same parent, always in T) as the pusher.
  for (int x = tid; x < n_t; x += nt) {
    const uint32_t m = lv.tm[cur][x];
    const uint32_t p = m & 0xffu;
    const int pnode = p == kLvRoot ? 0 : static_cast<int>(p) + 1;
    lv.kid[pnode * kLvMaxBudget + ((m >> 8) & 0xffu)] = static_cast<int16_t>(x + 1);
  }
  __syncthreads();
  for (int x = tid; x < n_t; x += nt) {
    const uint32_t m = lv.tm[cur][x];
    const uint32_t p = m & 0xffu;
    const int pnode = p == kLvRoot ? 0 : static_cast<int>(p) + 1;
    const int r = static_cast<int>((m >> 8) & 0xffu), d = static_cast<int>((m >> 16) & 0xffu);
    const int pred = r == 0 ? pnode : lv.kid[pnode * kLvMaxBudget + r - 1];
    sm.ninfo[x + 1] = pack(pnode, r, d, pred);
  }
  if (tid == 0) *sm.count = n_t;
  return true;
}
