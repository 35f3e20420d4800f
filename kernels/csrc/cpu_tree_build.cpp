// Compiled CPU DDTree tree builder and greedy accept: the honest CPU baseline.
//
// Same contract and the same answers, bit for bit, as kernels/reference.py `build_trees`,
// which mirrors liranringel/ddtree `build_ddtree_tree` (heapq of (-logw, rank_path, ...)).
// The heap here replays CPython's heapq algorithm step for step (heappush = append + siftdown,
// heappop = move last to the top + siftup to a leaf + siftdown) with the same comparison as
// Python's tuple `<` on (-logw, rank_path): first `==` on the negated scores, then `<` if
// they differ, else the rank paths lexicographically (a proper prefix first). Scores are
// float64 sums of float32 log-probs in the reference's order of operations. Replaying heapq
// exactly keeps the answers identical even for non-finite log-probs (NaN scores).
//
// A candidate is (negated score, parent node, depth, rank); its rank path is the parent's
// path (kept per node in a flat arena, H ints per node) plus its rank, so no per-candidate
// allocation happens. One thread, scratch buffers reused across calls.
//
// C ABI, returns 0 on success or a nonzero code (see the enum below).

#include <chrono>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace {

enum Status : int {
  kOk = 0,
  kBadShape = 1,    // B, H, K or budget negative
  kNullPointer = 2, // a required pointer is null
  kNoMemory = 3,    // scratch allocation failed
  kTooDeep = 4,     // accept walk longer than max_depth + 1
  kBadTree = 5,     // a child / sibling link out of range or cyclic
};

struct Cand {
  double neg;      // -logw, as the reference's heap key
  int32_t parent;  // node index of the parent (0 = root)
  int32_t depth;   // 1-based depth of this candidate
  int32_t rank;    // rank at its depth position
};

struct Builder {
  const int32_t* paths;  // arena: node i's rank path at paths[i * H], length depth(i)
  int H;

  // Python: tuple (-logw, ranks, ...) < tuple (-logw', ranks', ...).
  // Equal scores (rare outside forced ties) take the out-of-line rank-path walk.
  bool less(const Cand& a, const Cand& b) const {
    if (__builtin_expect(a.neg == b.neg, 0)) return path_less(a, b);
    return a.neg < b.neg;
  }

  bool path_less(const Cand& a, const Cand& b) const {
    // rank paths: parent path (depth-1 entries) + own rank
    const int32_t* pa = paths + static_cast<int64_t>(a.parent) * H;
    const int32_t* pb = paths + static_cast<int64_t>(b.parent) * H;
    const int n = (a.depth < b.depth ? a.depth : b.depth);
    for (int i = 0; i < n; ++i) {
      const int32_t ra = (i == a.depth - 1) ? a.rank : pa[i];
      const int32_t rb = (i == b.depth - 1) ? b.rank : pb[i];
      if (ra != rb) return ra < rb;
    }
    return a.depth < b.depth;
  }

  // heapq._siftdown(heap, startpos, pos)
  void siftdown(Cand* heap, int startpos, int pos) const {
    const Cand item = heap[pos];
    while (pos > startpos) {
      const int parentpos = (pos - 1) >> 1;
      if (less(item, heap[parentpos])) {
        heap[pos] = heap[parentpos];
        pos = parentpos;
        continue;
      }
      break;
    }
    heap[pos] = item;
  }

  // heapq._siftup(heap, pos)
  void siftup(Cand* heap, int endpos, int pos) const {
    const int startpos = pos;
    const Cand item = heap[pos];
    int childpos = 2 * pos + 1;
    while (childpos < endpos) {
      const int rightpos = childpos + 1;
      if (rightpos < endpos) childpos += !less(heap[childpos], heap[rightpos]);
      heap[pos] = heap[childpos];
      pos = childpos;
      childpos = 2 * pos + 1;
    }
    heap[pos] = item;
    siftdown(heap, startpos, pos);
  }
};

struct Scratch {
  std::vector<Cand> heap;
  std::vector<int32_t> paths;
  std::vector<int64_t> last_child;
};

// Builds one request's tree into padded outputs (already filled with -1 / false).
int64_t build_one(const float* lp, const int64_t* ids, int H, int K, int budget, Scratch& s,
                  int64_t* token_ids, int64_t* depths, int64_t* parents, uint8_t* vis,
                  int64_t* first_child, int64_t* next_sibling) {
  const int64_t stride = static_cast<int64_t>(budget) + 1;
  parents[0] = -1;
  vis[0] = 1;
  if (budget <= 0 || H == 0 || K == 0) return 0;

  Builder bld{s.paths.data(), H};
  Cand* heap = s.heap.data();
  int32_t* paths = s.paths.data();
  int64_t* last_child = s.last_child.data();
  last_child[0] = -1;

  int size = 1;
  heap[0] = Cand{-static_cast<double>(lp[0]), 0, 1, 0};
  int64_t n = 0;
  while (size > 0 && n < budget) {
    // heappop
    const Cand top = heap[0];
    --size;
    if (size > 0) {
      heap[0] = heap[size];
      bld.siftup(heap, size, 0);
    }
    const double logw = -top.neg;
    const int d = top.depth, r = top.rank, p = top.parent;
    const int64_t node = ++n;
    const float* row = lp + static_cast<int64_t>(d - 1) * K;

    token_ids[node - 1] = ids[static_cast<int64_t>(d - 1) * K + r];
    depths[node - 1] = d;
    parents[node] = p;
    int32_t* path = paths + node * H;
    std::memcpy(path, paths + static_cast<int64_t>(p) * H, sizeof(int32_t) * (d - 1));
    path[d - 1] = r;
    uint8_t* vrow = vis + node * stride;
    std::memcpy(vrow, vis + static_cast<int64_t>(p) * stride, static_cast<size_t>(p) + 1);
    vrow[node] = 1;
    if (last_child[p] < 0) {
      first_child[p] = node;
    } else {
      next_sibling[last_child[p]] = node;
    }
    last_child[p] = node;
    last_child[node] = -1;

    if (r + 1 < K) {  // heappush(next sibling)
      const double sib = logw - static_cast<double>(row[r]) + static_cast<double>(row[r + 1]);
      heap[size] = Cand{-sib, p, d, r + 1};
      bld.siftdown(heap, 0, size);
      ++size;
    }
    if (d < H) {  // heappush(first child)
      const double child = logw + static_cast<double>(lp[static_cast<int64_t>(d) * K]);
      heap[size] = Cand{-child, static_cast<int32_t>(node), d + 1, 0};
      bld.siftdown(heap, 0, size);
      ++size;
    }
  }
  return n;
}

}  // namespace

extern "C" int ddtree_cpu_build_trees(const float* lp, const int64_t* ids, int B, int H, int K,
                                      int budget, int64_t* token_ids, int64_t* depths,
                                      int64_t* parents, uint8_t* visibility,
                                      int64_t* first_child, int64_t* next_sibling,
                                      int64_t* num_nodes) {
  if (B < 0 || H < 0 || K < 0 || budget < 0) return kBadShape;
  if (!parents || !visibility || !first_child || !next_sibling || !num_nodes) return kNullPointer;
  if ((budget > 0 && (!token_ids || !depths)) || (B > 0 && H > 0 && K > 0 && (!lp || !ids)))
    return kNullPointer;
  const int64_t stride = static_cast<int64_t>(budget) + 1;
  static thread_local Scratch s;
  try {
    s.heap.resize(static_cast<size_t>(budget) + 2);
    s.paths.resize(static_cast<size_t>(stride) * (H > 0 ? H : 1));
    s.last_child.resize(static_cast<size_t>(stride));
  } catch (const std::bad_alloc&) {
    return kNoMemory;
  }
  const int64_t hk = static_cast<int64_t>(H) * K;
  for (int b = 0; b < B; ++b) {
    int64_t* tok = token_ids + static_cast<int64_t>(b) * budget;
    int64_t* dep = depths + static_cast<int64_t>(b) * budget;
    int64_t* par = parents + b * stride;
    uint8_t* vis = visibility + b * stride * stride;
    int64_t* fc = first_child + b * stride;
    int64_t* ns = next_sibling + b * stride;
    for (int64_t i = 0; i < budget; ++i) tok[i] = dep[i] = -1;
    for (int64_t i = 0; i < stride; ++i) par[i] = fc[i] = ns[i] = -1;
    std::memset(vis, 0, static_cast<size_t>(stride * stride));
    num_nodes[b] = build_one(lp + b * hk, ids + b * hk, H, K, budget, s, tok, dep, par, vis, fc,
                             ns);
  }
  return kOk;
}

// Greedy accept over padded trees: accepted [B, max_depth+1] (-1 padded), accept_len [B],
// bonus [B]; target_ids [B, budget+1]. Children scanned in first_child/next_sibling order.
extern "C" int ddtree_cpu_greedy_accept(const int64_t* token_ids, const int64_t* first_child,
                                        const int64_t* next_sibling, const int64_t* target_ids,
                                        int B, int budget, int max_depth, int64_t* accepted,
                                        int64_t* accept_len, int64_t* bonus) {
  if (B < 0 || budget < 0 || max_depth < 0) return kBadShape;
  if (B > 0 && (!first_child || !next_sibling || !target_ids || !accepted || !accept_len ||
                !bonus || (budget > 0 && !token_ids)))
    return kNullPointer;
  const int64_t stride = static_cast<int64_t>(budget) + 1;
  const int64_t width = static_cast<int64_t>(max_depth) + 1;
  for (int b = 0; b < B; ++b) {
    const int64_t* tok = token_ids + static_cast<int64_t>(b) * budget;
    const int64_t* fc = first_child + b * stride;
    const int64_t* ns = next_sibling + b * stride;
    const int64_t* tgt = target_ids + b * stride;
    int64_t* acc = accepted + b * width;
    for (int64_t i = 0; i < width; ++i) acc[i] = -1;
    int64_t cur = 0, len = 1;
    acc[0] = 0;
    for (;;) {
      const int64_t want = tgt[cur];
      int64_t c = fc[cur];
      for (int64_t steps = 0; c >= 0; ++steps) {  // bounds-checked: trees come from callers
        if (c == 0 || c > budget || steps >= budget) return kBadTree;
        if (tok[c - 1] == want) break;
        c = ns[c];
      }
      if (c < 0) break;
      if (len >= width) return kTooDeep;
      acc[len++] = c;
      cur = c;
    }
    accept_len[b] = len;
    bonus[b] = tgt[cur];
  }
  return kOk;
}

// Core timing for baselines: builds the same trees `reps` times into scratch outputs and
// writes each call's wall time (steady clock, seconds) to seconds[reps]; no Python overhead.
extern "C" int ddtree_cpu_time_build_trees(const float* lp, const int64_t* ids, int B, int H,
                                           int K, int budget, int reps, double* seconds) {
  if (B < 0 || H < 0 || K < 0 || budget < 0 || reps < 0) return kBadShape;
  if (!seconds && reps > 0) return kNullPointer;
  const size_t b = static_cast<size_t>(B), s = static_cast<size_t>(budget) + 1;
  std::vector<int64_t> tok, dep, par, fc, ns, nn;
  std::vector<uint8_t> vis;
  try {
    tok.resize(b * budget + 1);
    dep.resize(b * budget + 1);
    par.resize(b * s);
    fc.resize(b * s);
    ns.resize(b * s);
    nn.resize(b + 1);
    vis.resize(b * s * s + 1);
  } catch (const std::bad_alloc&) {
    return kNoMemory;
  }
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = ddtree_cpu_build_trees(lp, ids, B, H, K, budget, tok.data(), dep.data(),
                                          par.data(), vis.data(), fc.data(), ns.data(), nn.data());
    const auto t1 = std::chrono::steady_clock::now();
    if (rc != kOk) return rc;
    seconds[r] = std::chrono::duration<double>(t1 - t0).count();
  }
  return kOk;
}
