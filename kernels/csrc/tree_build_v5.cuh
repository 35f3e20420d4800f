// tree_build_v5.cuh: the v5 best-first loop of the tree build (DDTREE_TREE_ALGO=v5): up to two
// pops per warp vote. Included by tree_build.cu inside its anonymous namespace, after
// pop_loop_v4, whose helpers (pack/info_*, key_of, path_less_v4, lds_u64, slot_of) it uses.
//
// Why two pops are exact: after the best candidate x is popped, the next best is the best of
// {y, sib(x), chd(x)}, y being the runner-up of the frontier before the pop (every other
// frontier entry ranks below y). One more redux gives y (each lane offers its best slot, lane
// w, the winner's, its second best); sib(x) and chd(x) have known 64-bit keys. The second pop
// happens only when its winner is proven by a strict comparison of the upper 27 key bits (y
// against the better successor, and y unique among the lanes); any equality there (equal
// keys, 1-ulp anomalies of s - a + b) leaves it to the next vote, which is the v4 vote with
// its exact fallback. No monotonicity of the scores is assumed.
//
// Outcome on an H200 (benchmarks/NOTES-kernels-i.md): two pops in ~98% of the votes on the
// benchmark's inputs, yet slower than v4 (B=64, H=15, budget 64: 24.6 / 24.9 us vs 21.3 /
// 22.4 us for K=8 / 64): an iteration is ~440 SASS instructions at ~3.3 cycles each, so the cost
// follows the instruction count per pop, not the number of votes. Kept opt-in as groundwork.
#pragma once

// Float64 log-probs one level further from a popped candidate (depth d, rank r): the five
// table entries its successors' successors need.
struct V5Ld {
  double a, b, c, d, e;
};

__device__ __forceinline__ V5Ld v5_load(const double* lp, int HK, int K, int d, int r) {
  const int row = (d - 1) * K + r;
  V5Ld v;
  v.a = lp[min(row + 1, HK - 1)];
  v.b = lp[min(row + 2, HK - 1)];
  v.c = lp[min(d * K, HK - 1)];
  v.d = lp[min(d * K + 1, HK - 1)];
  v.e = lp[min((d + 1) * K, HK - 1)];
  return v;
}

// Keys (0: none) of sib(sib(c)), chd(sib(c)), sib(chd(c)), chd(chd(c)) for the popped
// candidate c at (d, r) whose sibling has key ks and child key kc; the reference's float64
// order: sibling (s - lp[r]) + lp[r + 1], child s + lp[0] of the next row.
struct V5Keys {
  uint64_t ss, sc, cs, cc;
};

__device__ __forceinline__ V5Keys v5_keys(const V5Ld& v, uint64_t ks, uint64_t kc, int H, int K,
                                          int d, int r) {
  // Computed unconditionally (garbage where absent), then selected: no branches.
  const double s = ddtree::key_double(ks), c = ddtree::key_double(kc);
  const uint64_t ss = key_of((s - v.a) + v.b), sc = key_of(s + v.c);
  const uint64_t cs = key_of((c - v.c) + v.d), cc = key_of(c + v.e);
  V5Keys o;
  o.ss = r + 2 < K ? ss : 0ull;
  o.sc = (r + 1 < K && d < H) ? sc : 0ull;
  o.cs = (d < H && K > 1) ? cs : 0ull;
  o.cc = d + 1 < H ? cc : 0ull;
  return o;
}

// The vote word: upper 27 bits of the key's high word, low 5 bits 31 - lane (0: no key).
__device__ __forceinline__ uint32_t v5_word(uint64_t k, int lane) {
  return k != 0 ? (static_cast<uint32_t>(k >> 32) & ~31u) | static_cast<uint32_t>(31 - lane)
                : 0u;
}

template <int S>
__device__ void pop_loop_v5(const Smem& sm, int H, int K, int budget) {
  const int lane = threadIdx.x & 31;
  const double* lp = sm.lpd;
  const int HK = H * K;
  uint64_t* const rinfo = sm.rinfo;
  uint64_t* const rskey = sm.rskey;
  uint64_t* const rckey = sm.rckey;
  uint64_t* const ninfo = sm.ninfo;
  const bool l0 = lane == 0;
  uint64_t key[S];
#pragma unroll
  for (int t = 0; t < S; ++t) key[t] = 0;
  if (l0) {
    const double s0 = lp[0];
    key[0] = key_of(s0);
    rinfo[0] = pack(0, 0, 1, 0);
    rskey[0] = K > 1 ? key_of(s0 - lp[0] + lp[1]) : 0ull;
    rckey[0] = H > 1 ? key_of(s0 + lp[K]) : 0ull;
  }
  __syncwarp();
  // Deferred work of the previous iteration's second pop z: the successor keys of its new
  // candidates (slots qs: sib(z), qc: chd(z); -1 none), loads issued a vote ago.
  V5Ld q{0.0, 0.0, 0.0, 0.0, 0.0};
  uint64_t qks = 0, qkc = 0;
  int qd = 1, qr = 0, qs = -1, qc = -1;
  int n = 0, F = 1;
  while (n < budget) {
    // Lane-local best and runner-up (full comparator; equal keys: rank path, rare).
    uint64_t bk = key[0], bk2 = 0;
    int bt = 0, bt2 = 0;
#pragma unroll
    for (int t = 1; t < S; ++t) {
      const uint64_t k = key[t];
      bool best = k > bk;
      if (k == bk && k != 0)
        best = path_less_v4(rinfo[lane + 32 * t], rinfo[lane + 32 * bt], ninfo);
      if (best) {
        bk2 = bk; bt2 = bt; bk = k; bt = t;
      } else {
        bool second = k > bk2;
        if (k == bk2 && k != 0)
          second = path_less_v4(rinfo[lane + 32 * t], rinfo[lane + 32 * bt2], ninfo);
        if (second) { bk2 = k; bt2 = t; }
      }
    }
    uint32_t btb[4] = {0u, 0u, 0u, 0u}, btb2[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int k = 0; (1 << k) < S; ++k) {
      btb[k] = __ballot_sync(kFull, (bt >> k) & 1);
      btb2[k] = __ballot_sync(kFull, (bt2 >> k) & 1);
    }
    const uint32_t hk = v5_word(bk, lane);
    const uint32_t mh = __reduce_max_sync(kFull, hk);
    {  // The deferred keys (none: qs = qc = -1), stored before the record loads.
      const V5Keys o = v5_keys(q, qks, qkc, H, K, qd, qr);
      if (l0 && qs >= 0) { rskey[qs] = o.ss; rckey[qs] = o.sc; }
      if (l0 && qc >= 0) { rskey[qc] = o.cs; rckey[qc] = o.cc; }
      qs = -1; qc = -1;
    }
    __syncwarp();
    if (mh == 0) break;  // frontier empty
    int w = 31 - static_cast<int>(mh & 31u);
    int wid = w + 32 * slot_of<S>(btb, w);
    uint64_t wi = lds_u64(rinfo + wid), wsk = lds_u64(rskey + wid);
    uint64_t wck = lds_u64(rckey + wid);
    // Second vote: the runner-up y of the frontier before this pop (lane w offers its second);
    // y's record is loaded now, beside x's (its slot is not written before the second pop).
    const uint32_t hk2 = lane == w ? v5_word(bk2, lane) : hk;
    const uint32_t mh2 = __reduce_max_sync(kFull, hk2);
    const uint32_t amb = __ballot_sync(kFull, hk != 0 && (hk >> 5) == (mh >> 5));
    const uint32_t amb2 = __ballot_sync(kFull, hk2 != 0 && (hk2 >> 5) == (mh2 >> 5));
    const int w2 = 31 - static_cast<int>(mh2 & 31u);
    const int yslot = w2 + 32 * (w2 == w ? slot_of<S>(btb2, w2) : slot_of<S>(btb, w2));
    const uint64_t yi = lds_u64(rinfo + yslot), ysk = lds_u64(rskey + yslot);
    const uint64_t yck = lds_u64(rckey + yslot);
    bool pair = true;
    if (amb & (amb - 1)) {  // rare: exact vote (as v4), and a single pop this iteration
      pair = false;
      const uint32_t hi = static_cast<uint32_t>(bk >> 32);
      const uint32_t hmax = __reduce_max_sync(kFull, bk != 0 ? hi : 0u);
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
          if (path_less_v4(li, wi0, ninfo)) { w = l; wi0 = li; }
        }
      }
      wid = w + 32 * slot_of<S>(btb, w);
      wi = rinfo[wid]; wsk = rskey[wid]; wck = rckey[wid];
    }
    ++n;
    if (l0) ninfo[n] = wi;
    if (n == budget) break;
    const int r = info_r(wi), d = info_d(wi);
    const V5Ld lx = v5_load(lp, HK, K, d, r);
    // x's successors: the sibling replaces x in slot wid, the child goes to csl.
    const bool has_sib = r + 1 < K, has_chd = d < H;
    const int csl = has_sib ? F : wid;
    if (has_sib && has_chd) ++F;
    {
      const uint64_t wnew = has_sib ? wsk : wck;  // wck is 0 when there is no child
      const int wl = wid & 31, wt = wid >> 5, cl = csl & 31, ct = csl >> 5;
#pragma unroll
      for (int t = 0; t < S; ++t) {
        if (lane == wl && t == wt) key[t] = wnew;
        if (has_chd && lane == cl && t == ct) key[t] = wck;
      }
    }
    const uint64_t pn = static_cast<uint64_t>(n & 0xffff) << 33;
    const uint64_t sib_i = ((wi & ~(0xffffull << 33)) + (1ull << 16)) | pn;
    const uint64_t chd_i = static_cast<uint64_t>(n) | (static_cast<uint64_t>(d + 1) << 27) | pn;
    if (l0 && has_sib) rinfo[wid] = sib_i;
    if (l0 && has_chd) rinfo[csl] = chd_i;
    // Which is next: y (1), sib(x) (2), chd(x) (3), or unproven (0). On equal keys the child
    // ranks first (its rank path extends x; the sibling's differs from x at x's last rank).
    int z = 0;
    if (pair) {
      const bool chd_first = wck >= wsk;
      const uint64_t sk = chd_first ? wck : wsk;
      const uint32_t s27 = static_cast<uint32_t>(sk >> 37), y27 = mh2 >> 5;
      if (y27 > s27 && !(amb2 & (amb2 - 1))) z = 1;
      else if (s27 > y27) z = chd_first ? 3 : 2;
    }
    // The successors' successors of x: stored now for the ones that stay in the frontier.
    const V5Keys ox = v5_keys(lx, wsk, wck, H, K, d, r);
    if (l0 && has_sib && z != 2) { rskey[wid] = ox.ss; rckey[wid] = ox.sc; }
    if (l0 && has_chd && z != 3) { rskey[csl] = ox.cs; rckey[csl] = ox.cc; }
    if (z != 0) {  // uniform: the second pop
      uint64_t zi, zsk, zck;
      int zslot;
      if (z == 1) {
        zslot = yslot; zi = yi; zsk = ysk; zck = yck;
      } else if (z == 2) {
        zslot = wid; zi = sib_i; zsk = ox.ss; zck = ox.sc;
      } else {
        zslot = csl; zi = chd_i; zsk = ox.cs; zck = ox.cc;
      }
      ++n;
      if (l0) ninfo[n] = zi;
      if (n == budget) break;
      const int r2 = info_r(zi), d2 = info_d(zi);
      q = v5_load(lp, HK, K, d2, r2);
      const bool has_sib2 = r2 + 1 < K, has_chd2 = d2 < H;
      const int csl2 = has_sib2 ? F : zslot;
      if (has_sib2 && has_chd2) ++F;
      const uint64_t znew = has_sib2 ? zsk : zck;
      const int zl = zslot & 31, zt = zslot >> 5, cl2 = csl2 & 31, ct2 = csl2 >> 5;
#pragma unroll
      for (int t = 0; t < S; ++t) {
        if (lane == zl && t == zt) key[t] = znew;
        if (has_chd2 && lane == cl2 && t == ct2) key[t] = zck;
      }
      const uint64_t pn2 = static_cast<uint64_t>(n & 0xffff) << 33;
      if (l0 && has_sib2) rinfo[zslot] = ((zi & ~(0xffffull << 33)) + (1ull << 16)) | pn2;
      if (l0 && has_chd2)
        rinfo[csl2] = static_cast<uint64_t>(n) | (static_cast<uint64_t>(d2 + 1) << 27) | pn2;
      qks = zsk; qkc = zck; qd = d2; qr = r2;
      qs = has_sib2 ? zslot : -1;
      qc = has_chd2 ? csl2 : -1;
    }
    __syncwarp();
  }
  if (l0) *sm.count = n;
}
