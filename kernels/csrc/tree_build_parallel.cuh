// tree_build_parallel.cuh: the opt-in parallel selection of the tree build
// (DDTREE_TREE_PARALLEL=1): Delta-stepping rounds over the candidate tree, then an exact
// verification of the best-first order with the serial v1 loop as the fallback (see the
// overview at the top of tree_build.cu). Included by tree_build.cu inside its anonymous
// namespace.
#pragma once

__device__ __forceinline__ uint64_t entry_info(const Smem& sm, int e) {
  return pack(sm.epar[e], sm.erank[e], sm.edepth[e], 0);
}

// Entry a ranks before entry b: higher score, then smaller rank path.
__device__ __forceinline__ bool entry_before(const Smem& sm, int a, int b) {
  const uint64_t ka = sm.ekey[a], kb = sm.ekey[b];
  if (ka != kb) return ka > kb;
  return path_less(entry_info(sm, a), entry_info(sm, b), sm.epar, sm.erank);
}

// Block-wide sum of per-thread counts.
__device__ __forceinline__ int block_count(int c, const Smem& sm) {
  return static_cast<int>(ddtree::block_sum_u32(static_cast<uint32_t>(c),
                                                reinterpret_cast<uint32_t*>(sm.red)));
}

// Parallel selection (see the file comment). Returns true and fills parent/rank/depth/pred
// and *count on success; false (nothing usable written) when the caller must fall back.
__device__ bool parallel_select(const Smem& sm, int H, int K, int budget) {
  const int tid = threadIdx.x;
  const float* lp = sm.lp;
  if (tid == 0) {
    sm.ekey[0] = ~0ull; sm.epar[0] = -1; sm.erank[0] = 0; sm.edepth[0] = 0; sm.egen[0] = -1;
    sm.estate[0] = 1; sm.epos[0] = 0;
    sm.ekey[1] = ddtree::double_key(static_cast<double>(lp[0]));
    sm.epar[1] = 0; sm.erank[1] = 0; sm.edepth[1] = 1; sm.egen[1] = 0; sm.estate[1] = 0;
    sm.epos[1] = -1;
    sm.ctl[0] = 2; sm.ctl[1] = 0; sm.ctl[2] = 0; sm.ctl[3] = 0;
  }
  __syncthreads();
  while (true) {
    // Round: theta from the frontier, by bisection on counts (about a quarter of what is left).
    const int ne = sm.ctl[0], popped = sm.ctl[1];
    if (popped >= budget) break;
    uint64_t kmax = 0, kmin_inv = 0;
    int nf = 0;
    for (int e = tid; e < ne; e += kThreads) {
      if (sm.estate[e] == 0) {
        const uint64_t k = sm.ekey[e];
        kmax = k > kmax ? k : kmax;
        kmin_inv = ~k > kmin_inv ? ~k : kmin_inv;
        ++nf;
      }
    }
    nf = block_count(nf, sm);
    if (nf == 0) break;  // the whole tree is popped
    kmax = ddtree::block_max_u64(kmax, sm.red);
    kmin_inv = ddtree::block_max_u64(kmin_inv, sm.red);
    const int m = max(1, (budget - popped) / 4);
    double hi = ddtree::key_double(kmax), lo = ddtree::key_double(~kmin_inv);
    double theta = lo;
    auto count_ge = [&](double x) {
      const uint64_t kx = ddtree::double_key(x);
      int c = 0;
      for (int e = tid; e < ne; e += kThreads) c += (sm.estate[e] == 0 && sm.ekey[e] >= kx);
      return block_count(c, sm);
    };
    if (nf > m) {
      for (int it = 0; it < 10; ++it) {
        const double mid = lo + 0.5 * (hi - lo);
        if (count_ge(mid) <= m) hi = mid; else lo = mid;
      }
      theta = hi;
    }
    const uint64_t tkey = ddtree::double_key(theta);
    // Sub-steps: pop every frontier entry >= theta (new entries wait for the next sub-step).
    while (true) {
      const int end = sm.ctl[0];
      __syncthreads();  // everyone has read `end` before anyone appends
      int any = 0;
      for (int e = tid; e < end; e += kThreads) {
        if (sm.estate[e] != 0 || sm.ekey[e] < tkey) continue;
        any = 1;
        sm.estate[e] = 1;
        const int pi = atomicAdd(&sm.ctl[1], 1);
        if (pi < sm.cap) sm.plist[pi] = static_cast<int16_t>(e);
        const int r = sm.erank[e], d = sm.edepth[e];
        const bool has_sib = r + 1 < K, has_chd = d < H;
        const int ns = int(has_sib) + int(has_chd);
        if (ns == 0) continue;
        const int slot = atomicAdd(&sm.ctl[0], ns);
        if (slot + ns > sm.cap) { sm.ctl[2] = 1; continue; }
        const double s = ddtree::key_double(sm.ekey[e]);
        int o = slot;
        if (has_sib) {
          const float* row = lp + (d - 1) * K;
          const double v = s - static_cast<double>(row[r]) + static_cast<double>(row[r + 1]);
          sm.ekey[o] = ddtree::double_key(v); sm.epar[o] = sm.epar[e];
          sm.erank[o] = static_cast<int16_t>(r + 1); sm.edepth[o] = static_cast<int16_t>(d);
          sm.egen[o] = static_cast<int16_t>(e); sm.estate[o] = 0; sm.epos[o] = -1;
          ++o;
        }
        if (has_chd) {
          const double v = s + static_cast<double>(lp[d * K]);
          sm.ekey[o] = ddtree::double_key(v); sm.epar[o] = static_cast<int16_t>(e);
          sm.erank[o] = 0; sm.edepth[o] = static_cast<int16_t>(d + 1);
          sm.egen[o] = static_cast<int16_t>(e); sm.estate[o] = 0; sm.epos[o] = -1;
        }
      }
      if (!__syncthreads_or(any)) break;
      if (sm.ctl[2] || sm.ctl[1] > sm.cap) return false;  // overflow: fall back (uniform)
    }
  }
  __syncthreads();
  const int np = sm.ctl[1], ne = sm.ctl[0];
  const int n = min(np, budget);
  // Rank every popped entry by the exact comparator.
  for (int i = tid; i < np; i += kThreads) {
    const int v = sm.plist[i];
    int pos = 1;
    for (int j = 0; j < np; ++j) pos += (j != i) && entry_before(sm, sm.plist[j], v);
    sm.epos[v] = static_cast<int16_t>(pos);
  }
  __syncthreads();
  // Verify, and find the last selected entry.
  __shared__ int s_last;
  for (int i = tid; i < np; i += kThreads) {
    const int v = sm.plist[i];
    const int p = sm.epos[v];
    if (p == n) s_last = v;
    if (p <= n && sm.epos[sm.egen[v]] >= p) sm.ctl[3] = 1;  // generator must come first
  }
  __syncthreads();
  const int last = s_last;
  for (int e = 2 + tid; e < ne; e += kThreads) {
    if (sm.estate[e] != 0) continue;
    const int g = sm.egen[e];
    if (sm.epos[g] <= n && !entry_before(sm, last, e)) sm.ctl[3] = 1;  // boundary after last
  }
  if (__syncthreads_or(sm.ctl[3])) return false;
  for (int i = tid; i < np; i += kThreads) {
    const int v = sm.plist[i];
    const int p = sm.epos[v];
    if (p > n) continue;
    sm.parent[p] = sm.epos[sm.epar[v]];
    sm.rank[p] = sm.erank[v];
    sm.depth[p] = sm.edepth[v];
    sm.pred[p] = sm.epos[sm.egen[v]];
  }
  if (tid == 0) *sm.count = n;
  return true;
}
