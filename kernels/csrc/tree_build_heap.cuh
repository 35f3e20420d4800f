// tree_build_heap.cuh: the heap best-first loop of the tree build: only the frontier
// keys in registers, candidate records in shared memory, one redux.sync per pop in the common
// case. Included by tree_build.cu inside its anonymous namespace, after pop_loop_lowmem, whose
// Smem layout and pack/info_* helpers it uses.
#pragma once

// ddtree::double_key with the -0.0 fold done on the integer (no float64 add in the chain).
__device__ __forceinline__ uint64_t key_of(double x) {
  uint64_t u = static_cast<uint64_t>(__double_as_longlong(x));
  u = (u << 1) == 0 ? 0ull : u;
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

// path_less over the heap node records (parent and rank packed in ninfo).
__device__ __noinline__ bool path_less_heap(uint64_t a, uint64_t b, const uint64_t* ninfo) {
  int pa = info_p(a), ra = info_r(a), da = info_d(a);
  int pb = info_p(b), rb = info_r(b), db = info_d(b);
  if (da > db) {
    while (da > db) { const uint64_t x = ninfo[pa]; ra = info_r(x); pa = info_p(x); --da; }
    if (pa == pb && ra == rb) return false;  // b is a prefix of a
  } else if (db > da) {
    while (db > da) { const uint64_t x = ninfo[pb]; rb = info_r(x); pb = info_p(x); --db; }
    if (pa == pb && ra == rb) return true;  // a is a prefix of b
  } else if (pa == pb && ra == rb) {
    return false;
  }
  while (pa != pb) {
    const uint64_t x = ninfo[pa], y = ninfo[pb];
    ra = info_r(x); pa = info_p(x);
    rb = info_r(y); pb = info_p(y);
  }
  return ra < rb;
}

__device__ __forceinline__ uint64_t lds_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.shared.u64 %0, [%1];"
               : "=l"(v)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p)))
               : "memory");
  return v;
}

// Slot index (0..S-1) of lane w's best slot, from the ballots of its bits.
template <int S>
__device__ __forceinline__ int slot_of(const uint32_t (&btb)[4], int w) {
  int wt = 0;
#pragma unroll
  for (int k = 0; (1 << k) < S; ++k) wt |= static_cast<int>((btb[k] >> w) & 1u) << k;
  return wt;
}

// The heap best-first loop of warp 0 (pop_loop_lowmem is the low-memory kernel's). Same pop
// order, a shorter chain per pop and fewer instructions (one warp issues them all):
//  * registers hold only the frontier keys, S slots per lane (slot id = lane + 32 t); the rest
//    of a candidate lives in shared memory by slot id: its (parent, rank, depth, pred) and the
//    keys of its own next sibling and first child, so a pop only moves keys;
//  * the vote is one redux.sync on the key's high word (the low word and the rank-path
//    comparison run only when lanes tie: uniform branches); the winner's slot index comes from
//    ballots taken beside the redux, not from a shuffle;
//  * the float64 scores one level further (the new candidates' own sibling and child keys) are
//    computed by lanes 0-3 in parallel, loads issued in this pop and the arithmetic and stores
//    in the next one, after its redux, so they stay off the chain.
template <int S>
__device__ void pop_loop_heap(const Smem& sm, int H, int K, int budget) {
  const int lane = threadIdx.x & 31;
  const double* lp = sm.lpd;
  const int HK = H * K;
  uint64_t* const rinfo = sm.rinfo;
  uint64_t* const ninfo = sm.ninfo;
  uint64_t key[S];
#pragma unroll
  for (int t = 0; t < S; ++t) key[t] = 0;
  if (lane == 0) {
    const double s0 = lp[0];
    key[0] = key_of(s0);
    rinfo[0] = pack(0, 0, 1, 0);
    sm.rskey[0] = K > 1 ? key_of(s0 - lp[0] + lp[1]) : 0ull;
    sm.rckey[0] = H > 1 ? key_of(s0 + lp[K]) : 0ull;
  }
  __syncwarp();
  // Pending float64 work of lanes 0-3 for the previous pop: key (pb + px) + py, stored to
  // slot pt of rskey (lanes 0, 2) or rckey (lanes 1, 3); pv false: store 0 (none).
  uint64_t pb = 0;
  double px = 0.0, py = 0.0;
  int pt = -1;
  bool pv = false;
  uint64_t* const pdst = (lane & 1) ? sm.rckey : sm.rskey;
  // Lane l < 4 works on row d - 1 + lrow (d: the popped node's depth); x is negated for lanes
  // 0 and 2 (table entry HK + 1 + i holds -lp[i]); y is table entry HK (0.0) for lanes 1, 3.
  // Its key exists when d * lcd + (lane 0: r) + lcc < llim: lane 0 r + 2 < K, lane 1
  // d < H, lane 2 1 < K, lane 3 d + 1 < H.
  const int lrow = (lane + 1) / 2 - 1;
  const int lcd = lane & 1, lcc = lane == 0 ? 2 : lane >> 1;
  const int lneg = (lane & 1) == 0 ? HK + 1 : 0;
  const bool lodd = (lane & 1) != 0, sib_side = lane < 2, l0 = lane == 0;
  const int llim = (lane == 0 || lane == 2) ? K : H;
  int n = 0, F = 1;
  while (n < budget) {
    // Lane-local best slot (equal keys: rank path, rare).
    uint64_t bk = key[0];
    int bt = 0;
#pragma unroll
    for (int t = 1; t < S; ++t) {
      bool take = key[t] > bk;
      if (key[t] == bk && bk != 0)
        take = path_less_heap(rinfo[lane + 32 * t], rinfo[lane + 32 * bt], ninfo);
      if (take) { bk = key[t]; bt = t; }
    }
    uint32_t btb[4] = {0u, 0u, 0u, 0u};  // bit k of every lane's best slot index
#pragma unroll
    for (int k = 0; (1 << k) < S; ++k) btb[k] = __ballot_sync(kFull, (bt >> k) & 1);
    // Vote: one redux.sync on the high word with its low 5 bits replaced by 31 - lane, so the
    // maximum names its lane. If another lane shares the winner's upper 27 bits (a ballot,
    // off the chain), redo it exactly: full 64-bit key, then the rank path.
    const uint32_t hi = static_cast<uint32_t>(bk >> 32);
    const uint32_t hk = bk != 0 ? (hi & ~31u) | static_cast<uint32_t>(31 - lane) : 0u;
    const uint32_t mh = __reduce_max_sync(kFull, hk);
    {  // The previous pop's pending keys (their loads were issued a pop ago).
      const uint64_t k = key_of((ddtree::key_double(pb) + px) + py);
      if (pt >= 0) pdst[pt] = pv ? k : 0ull;
    }
    __syncwarp();        // ... visible to the record loads below
    if (mh == 0) break;  // frontier empty
    int w = 31 - static_cast<int>(mh & 31u);
    const uint32_t amb = __ballot_sync(kFull, hk != 0 && (hk >> 5) == (mh >> 5));
    int wid = w + 32 * slot_of<S>(btb, w);
    // The winner's record, loaded before the ambiguity branch (asm volatile with a memory
    // clobber: not sunk below the branch, not hoisted above the pending stores).
    uint64_t wi = lds_u64(rinfo + wid), wsk = lds_u64(sm.rskey + wid);
    uint64_t wck = lds_u64(sm.rckey + wid);
    if (amb & (amb - 1)) {  // rare: exact vote
      const uint32_t hmax = __reduce_max_sync(kFull, hi);
      uint32_t tied = __ballot_sync(kFull, bk != 0 && hi == hmax);
      const uint32_t lo = static_cast<uint32_t>(bk);
      const uint32_t ml = __reduce_max_sync(kFull, (tied >> lane) & 1 ? lo : 0u);
      tied = __ballot_sync(kFull, ((tied >> lane) & 1) && lo == ml);
      w = __ffs(tied) - 1;
      if (tied & (tied - 1)) {  // equal keys in several lanes: rank path
        __syncwarp();
        const uint64_t mine_i = rinfo[lane + 32 * bt];
        uint64_t wi0 = __shfl_sync(kFull, mine_i, w);
        uint32_t rest = tied & (tied - 1);
        while (rest) {
          const int l = __ffs(rest) - 1;
          rest &= rest - 1;
          const uint64_t li = __shfl_sync(kFull, mine_i, l);
          if (path_less_heap(li, wi0, ninfo)) { w = l; wi0 = li; }
        }
      }
      wid = w + 32 * slot_of<S>(btb, w);
      wi = rinfo[wid]; wsk = sm.rskey[wid]; wck = sm.rckey[wid];
    }
    const int wt = wid >> 5;
    ++n;
    if (l0) ninfo[n] = wi;
    if (n == budget) break;
    const int r = info_r(wi), d = info_d(wi);
    const bool has_sib = r + 1 < K, has_chd = d < H, both = has_sib && has_chd;
    const int csl = has_sib ? F : wid;  // the child's slot
    const int cl = csl & 31, ct = csl >> 5;
    if (both) ++F;
    // Keys: the sibling replaces the winner, the child goes to csl (appended if both).
    const uint64_t wnew = has_sib ? wsk : wck;  // wck is 0 when there is no child
#pragma unroll
    for (int t = 0; t < S; ++t) {
      if (lane == w && t == wt) key[t] = wnew;
      if (has_chd && lane == cl && t == ct) key[t] = wck;
    }
    // Records of the new candidates: lane 0 the sibling, lane 1 the child.
    const uint64_t pn = static_cast<uint64_t>(n & 0xffff) << 33;
    const uint64_t sib_i = ((wi & ~(0xffffull << 33)) + (1ull << 16)) | pn;
    const uint64_t chd_i = static_cast<uint64_t>(n) | (static_cast<uint64_t>(d + 1) << 27) | pn;
    if (l0 && has_sib) rinfo[wid] = sib_i;
    if (lane == 1 && has_chd) rinfo[csl] = chd_i;
    // Lanes 0, 1: the sibling's own sibling / child; lanes 2, 3: the child's. No loaded value
    // is used before the next pop.
    const int base = (d + lrow) * K + (l0 ? r + 1 : 0);
    px = lp[lneg + min(base, HK - 1)];
    py = lp[lodd ? HK : min(base + 1, HK - 1)];
    pb = sib_side ? wsk : wck;
    pv = d * lcd + (l0 ? r : 0) + lcc < llim;
    pt = (sib_side ? has_sib : has_chd) ? (sib_side ? wid : csl) : -1;
    if (lane >= 4) pt = -1;
    __syncwarp();
  }
  if (lane == 0) *sm.count = n;
}
