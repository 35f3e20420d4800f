// tree_build_levels.cuh: the level-synchronous tree build (auto's first try for budget <= 64).
// Included by tree_build.cu inside its anonymous namespace, after the Smem layout, pack() and
// the heap loop (its fallback). Python model of the same decisions, checked against the
// reference on CPU: tests/helpers/tree_levels_model.py.
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
//   A (all threads, one candidate slot each): the children of T's depth-d nodes that can
//   still enter T (score >= T's last score when T is full; the j-th depth-d parent's child of
//   rank r has (j+1)(r+2)-1 nodes ahead of it, so r < budget/(j+1) - 1: at most 216 slots),
//   compacted in slot order by a ballot a warp,
//   C (all threads): every pool entry ranked by counting the entries scoring higher; T := the
//   best budget (the kept new nodes, in order, are the next level's parents),
// until no child qualifies. Node ids index an append-only log (parent id, rank, depth), so no
// parent pointer moves when T is re-ranked; a parent's children get consecutive ids, so a
// node's previous sibling (its pusher) is id - 1. Any tie among the kept nodes, a failed
// precondition or a full log returns false and the heap loop builds the tree instead,
// bit-exact either way; so does (under auto, not under DDTREE_TREE_LEVELS) a level of
// more than kLvWide candidates.
// Cost: 3 block barriers a level, levels = the tree's depth (2-4 for the benchmark's trees),
// instead of one dependent warp vote a node. The visibility rows go to a staged byte matrix
// in shared memory, copied out with 16-byte stores. Measured (H200) and what did not work:
// benchmarks/NOTES-kernels-i.md.
#pragma once

constexpr int kLvMaxBudget = 64;  // budgets above this take the heap loop
constexpr int kLvCap = 224;       // candidates a level: the bound gives at most 216, + 8 pad
constexpr int kLvLog = 1024;      // node log: every candidate ever made (else: the heap loop)
constexpr int kLvWide = 128;      // candidates in one level above which auto uses the heap loop
constexpr uint32_t kLvRoot = 0xfffu;
// Staged visibility bytes: (budget + 1)^2 <= 65^2, placed at the output's 16-byte phase.
constexpr int kLvVisBytes = ((kLvMaxBudget + 1) * (kLvMaxBudget + 1) + 15 + 15) / 16 * 16;

struct __align__(16) LvSmem {
  double tk[2][kLvMaxBudget];    // T's scores, sorted descending (double-buffered)
  uint32_t tm[2][kLvMaxBudget];  // T's node ids (into nlog) | depth << 16
  double ck[kLvCap];             // this level's candidates (16-byte aligned: 8-wide reads)
  double ps[kLvMaxBudget];       // this level's parents in order: score, node id
  uint32_t pid[kLvMaxBudget];
  uint32_t nlog[kLvLog];         // node id -> parent id (kLvRoot: root) | rank << 12 | depth << 20
  int16_t pos[kLvLog];           // node id -> node index in the final tree
  uint8_t vis[kLvVisBytes];      // the visibility matrix, staged at the output's 16-byte phase
  int16_t own[kLvMaxBudget];     // rank -> the pool entry that took it (ties: two claims)
  alignas(16) int wcnt[8];       // per warp: candidates it found this level
  int wemin[8];                  // per warp: smallest ulp exponent (lv_check)
  uint32_t wamax[8];             // per warp: largest magnitude, as float bits
};

__device__ __forceinline__ uint32_t lv_pack(uint32_t p, int r, int d) {
  return p | (static_cast<uint32_t>(r) << 12) | (static_cast<uint32_t>(d) << 20);
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

// Builds the tree into sm.ninfo[1..n] / *sm.count like pop_loop_heap and returns true, or
// returns false (nothing of the heap loop's state touched) when the input is not eligible.
// The block's verdict on the preconditions from the warps' lv_check results (after a barrier).
__device__ __forceinline__ bool lv_eligible(const LvSmem& lv, int H) {
  int emin = 1000;
  uint32_t amax = 0u;
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    emin = min(emin, lv.wemin[w]);
    amax = max(amax, lv.wamax[w]);
  }
  // 2^(53 + emin) built from its bits (emin is in [-149, 104]: a normal double).
  return emin >= 1000 ||
         static_cast<double>(H) * static_cast<double>(__uint_as_float(amax)) <
             __longlong_as_double(static_cast<long long>(53 + emin + 1023) << 52);
}

// A thread's candidate slot, fixed for the whole build. The j-th parent of a level (T being
// sorted, the j-th best of its depth-d nodes) can only add children of ranks r with
// (j + 1)(r + 2) <= budget (each has (j + 1)(r + 2) - 1 nodes of T ahead of it): at most
// 64 / (j + 1) - 1 of them, none from j = 32 on. Parent j gets that many rounded up to a power
// of two, in order: 64 slots for j = 0, 32 for 1 and 2, 16 for 3..5, 8 for 6..9, 4 for
// 10..15, 2 for 16..20, 1 for 21..31: 253 slots, one a thread, the same layout for every
// budget <= 64 and K (a slot is live when r < K and the bound holds). A parent's live slots
// are consecutive and in rank order, and the parents come in order, so compacting the
// passing slots in thread order gives a parent's children consecutive ids.
static_assert(kThreads == 256, "the level path: 253 slots, one a thread; 8 warps' counts");
struct LvSlot {
  int j, r;
  bool on;
};
__device__ __forceinline__ LvSlot lv_slot(int kc, int budget) {
  const int s = threadIdx.x;
  int j, r;
  if (s < 64) { j = 0; r = s; }
  else if (s < 128) { j = 1 + ((s - 64) >> 5); r = (s - 64) & 31; }
  else if (s < 176) { j = 3 + ((s - 128) >> 4); r = (s - 128) & 15; }
  else if (s < 208) { j = 6 + ((s - 176) >> 3); r = (s - 176) & 7; }
  else if (s < 232) { j = 10 + ((s - 208) >> 2); r = (s - 208) & 3; }
  else if (s < 242) { j = 16 + ((s - 232) >> 1); r = (s - 232) & 1; }
  else { j = 21 + (s - 242); r = 0; }
  LvSlot t;
  t.on = s < 253 && r < kc && (r + 2) * (j + 1) <= budget;
  t.j = t.on ? j : 0;
  t.r = t.on ? r : 0;
  return t;
}

// Builds the tree like pop_loop_heap (sm.ninfo[1..n], *sm.count) and also its links (sm.fc,
// sm.ns: the prologue set them to -1) and its visibility rows, as bytes into `stage` (row-major,
// n1 x n1, zeroed by the prologue), and returns true; or returns false (the heap loop's state
// untouched) at a tie or a full node log.
__device__ bool level_select(const Smem& sm, LvSmem& lv, int H, int K, int budget, uint8_t* stage,
                             int n1, bool strict) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const double* lp = sm.lpd;
  const int kc = min(K, budget);
  const LvSlot slot = lv_slot(kc, budget);
  const uint32_t lt = (1u << lane) - 1u;
  // Depth 1: the first kc entries of row 0 (the root's children, already in order), ids 0..;
  // they are also the first level's parents, in order. ps[j] is NaN where parent j does not
  // exist (NaN + anything fails every comparison).
  for (int i = tid; i < kLvMaxBudget; i += nt) {
    if (i < kc) {
      lv.tk[0][i] = lp[i];
      lv.tm[0][i] = static_cast<uint32_t>(i) | (1u << 16);
      lv.nlog[i] = lv_pack(kLvRoot, i, 1);
      lv.pid[i] = static_cast<uint32_t>(i);
      lv.pos[i] = static_cast<int16_t>(i + 1);
    }
    lv.ps[i] = i < kc ? lp[i] : NAN;
  }
  int cur = 0, n_t = kc, base = kc;
  __syncthreads();
  double tau = n_t == budget ? lv.tk[0][budget - 1] : -INFINITY;  // T's last score when full
  bool col = false;  // a rank claimed twice in the last ranking (a tie)
  for (int d = 1; d < H; ++d) {
    // A: every slot whose parent exists tests its child against tau; a ballot a warp and the
    // warps' counts give every candidate its place, in slot order, so a parent's children get
    // consecutive ids (a node's previous sibling, its pusher, is id - 1).
    double ckey = 0.0;
    bool pass = false;
    uint32_t pid = 0u;
    if (slot.on) {
      ckey = lv.ps[slot.j] + lp[d * K + slot.r];
      pid = lv.pid[slot.j];
      pass = ckey >= tau;
    }
    const uint32_t bal = __ballot_sync(kFull, pass);
    if (lane == 0) lv.wcnt[warp] = __popc(bal);
    if (__syncthreads_or(col)) return false;  // the last level's ranking had a tie
    int n_c = 0, at = __popc(bal & lt);  // candidates found / this one's place
    {
      const int4 c0 = reinterpret_cast<const int4*>(lv.wcnt)[0];
      const int4 c1 = reinterpret_cast<const int4*>(lv.wcnt)[1];
      const int cw[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        n_c += cw[w];
        at += w < warp ? cw[w] : 0;
      }
    }
    if (tid < 32) lv.ps[tid] = NAN;  // C names the next level's parents
    const int room = kLvLog - base;  // node log entries left
    if (n_c == 0) break;             // uniform: no child qualifies, T is final
    if (n_c > room) return false;
    // A level this wide (peaked drafts: many deep candidates near the top) makes the ranking
    // cost more than the heap loop would for the whole tree (H200: levels 31.8 us vs heap 22.2 us
    // at     // B=64, K=64, budget 64, logit scale 6, with the earlier serial walk), so auto hands
    // such a tree to the heap loop before ranking; DDTREE_TREE_LEVELS (strict) keeps going.
    if (!strict && n_c > kLvWide) return false;
    if (pass) {
      lv.ck[at] = ckey;
      lv.nlog[base + at] = lv_pack(pid, slot.r, d + 1);
    }
    if (tid < 8) lv.ck[n_c + tid] = -INFINITY;  // pads C's 8-wide reads
    __syncthreads();
    // C: rank of every pool entry (T then candidates) = entries scoring strictly higher: a
    // candidate's place in T by two rounds of eight independent loads, then a count over the
    // candidates, eight a step, split between two threads when the pool allows. Kept entries
    // (rank < budget) claim their rank in `own`: two kept entries with one rank are a tie
    // (found after the barrier; the heap loop takes over). A kept candidate with m candidates
    // above it is the next level's parent m.
    const int nxt = cur ^ 1, n_p = n_t + n_c;
    const bool pair = n_p <= nt / 2;
    int kr[2] = {-1, -1}, ke[2] = {0, 0};  // this thread's kept entries: rank, pool index
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
      if (rank < budget) {  // kept: node index rank + 1 (so far; pos as of the last level)
        kr[v] = rank;
        ke[v] = e;
        lv.own[rank] = static_cast<int16_t>(e);
        lv.tk[nxt][rank] = key;
        if (in_t) {
          const uint32_t tm = lv.tm[cur][e];
          lv.tm[nxt][rank] = tm;
          lv.pos[tm & (kLvLog - 1)] = static_cast<int16_t>(rank + 1);  // (mask: see below)
        } else {
          const uint32_t id = static_cast<uint32_t>(base + e - n_t);
          lv.tm[nxt][rank] = id | (static_cast<uint32_t>(d + 1) << 16);
          lv.pos[id] = static_cast<int16_t>(rank + 1);
          lv.ps[more] = key;  // (without ties, more < budget and unique)
          lv.pid[more] = id;
        }
      }
      if (pair) break;
    }
    __syncthreads();
    // A tie leaves two claims on one rank: checked at the next barrier (until then T may be
    // wrong, and nothing outside this level path's shared state is written).
    col = (kr[0] >= 0 && lv.own[kr[0]] != ke[0]) || (kr[1] >= 0 && lv.own[kr[1]] != ke[1]);
    cur = nxt;
    n_t = min(budget, n_p);
    base += n_c;
    // Done already when no new node was kept, or when T is full and the best new node's best
    // child (the next level's first candidate) cannot reach T's last score: skips the next
    // level's step A, which would find no child.
    const double p0 = lv.ps[0];
    tau = n_t == budget ? lv.tk[cur][budget - 1] : -INFINITY;
    if (isnan(p0)) break;
    if (d + 1 < H && p0 + lp[(d + 1) * K] < tau) break;
  }
  // T in order is the pop order: node x = slot + 1, and pos (node id -> x) holds it for every
  // node of T (written by the ranking that put it at its final place; after a tie T may hold
  // stale ids, and the mask keeps those writes inside pos until the barrier reports the tie).
  // Records as pop_loop_heap writes them (the pusher of rank r > 0 is rank r - 1 under the same
  // parent: always kept, id one less), the links, and the visibility rows (walking the log).
  if (__syncthreads_or(col)) return false;
  if (tid == 0) {
    stage[0] = 1;  // the root sees itself
    *sm.count = n_t;
  }
  for (int z = tid; z < n_t; z += nt) {
    const int x = z + 1;
    const uint32_t id = lv.tm[cur][z] & 0xffffu, rec = lv.nlog[id];
    const uint32_t p = rec & 0xfffu;
    const int r = static_cast<int>((rec >> 12) & 0xffu), d = static_cast<int>((rec >> 20) & 0x3fu);
    const int pnode = p == kLvRoot ? 0 : lv.pos[p];
    const int pred = r == 0 ? pnode : lv.pos[id - 1];
    sm.ninfo[x] = pack(pnode, r, d, pred);
    if (r == 0) sm.fc[pnode] = static_cast<int16_t>(x);
    else sm.ns[pred] = static_cast<int16_t>(x);
    uint8_t* row = stage + x * n1;
    row[0] = 1;
    row[x] = 1;
    for (uint32_t a = p; a != kLvRoot; a = lv.nlog[a] & 0xfffu) row[lv.pos[a]] = 1;
  }
  return true;
}
