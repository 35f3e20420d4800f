// tree_levels_profile.cu: where the cycles of the tree build go, phase by phase (clock64 of
// thread 0, blocks < 64), and its time per launch in a CUDA graph, on the benchmark's inputs
// (top-K of log_softmax over 4096 N(0, scale^2) logits a position).
//
// Build and run on the GPU host (repo root):
//   nvcc -arch=sm_90a -O3 -std=c++17 -DDDTREE_LV_PROFILE -Ikernels/csrc \
//     benchmarks/tree_levels_profile.cu -o /tmp/tree_prof
//   /tmp/tree_prof B H K budget scale      (DDTREE_TREE_ALGO picks the algorithm as usual)
// Prints one JSON line. Phases (cycles of thread 0, mean and max over blocks): 0 prologue
// (loads and the v6 precondition checks), 2 v6 step A (candidates) and 4 step C (ranking),
// summed over levels, 6 v6's records, links and ancestor bits, 7 from the prologue's end to the
// tree (includes 2-6, or the v4 pop loop), 8 the v4 path's links and bits, 3 token / parent /
// link stores, 10 visibility stores; 9 = levels run. Plus the last launch's block start spread
// and span (globaltimer, ns). The clock64 reads add a little to every phase.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tree_build.cu"

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                 \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s B H K budget scale\n", argv[0]);
    return 2;
  }
  const int B = atoi(argv[1]), H = atoi(argv[2]), K = atoi(argv[3]), budget = atoi(argv[4]);
  const double scale = atof(argv[5]);
  const int V = 4096, sets = 8;
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> lp(size_t(sets) * B * H * K);
  std::vector<int64_t> ids(lp.size());
  std::vector<float> x(V);
  std::vector<int> idx(V);
  for (size_t row = 0; row < size_t(sets) * B * H; ++row) {
    float mx = -INFINITY;
    for (int v = 0; v < V; ++v) { x[v] = nd(rng) * static_cast<float>(scale); mx = std::max(mx, x[v]); }
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    const float lse = mx + std::log(sum);
    for (int v = 0; v < V; ++v) idx[v] = v;
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                      [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int k = 0; k < K; ++k) {
      lp[row * K + k] = x[idx[k]] - lse;
      ids[row * K + k] = idx[k];
    }
  }
  float* d_lp;
  int64_t* d_ids;
  CK(cudaMalloc(&d_lp, lp.size() * 4));
  CK(cudaMalloc(&d_ids, ids.size() * 8));
  CK(cudaMemcpy(d_lp, lp.data(), lp.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_ids, ids.data(), ids.size() * 8, cudaMemcpyHostToDevice));
  const int n1 = budget + 1;
  int64_t *tok, *dep, *par, *fc, *ns, *nn;
  uint8_t* vis;
  CK(cudaMalloc(&tok, size_t(B) * budget * 8 + 8));
  CK(cudaMalloc(&dep, size_t(B) * budget * 8 + 8));
  CK(cudaMalloc(&par, size_t(B) * n1 * 8));
  CK(cudaMalloc(&fc, size_t(B) * n1 * 8));
  CK(cudaMalloc(&ns, size_t(B) * n1 * 8));
  CK(cudaMalloc(&nn, size_t(B) * 8));
  CK(cudaMalloc(&vis, size_t(B) * n1 * n1));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto launch = [&](int s) {
    return ddtree_build_trees(d_lp + size_t(s) * B * H * K, d_ids + size_t(s) * B * H * K, B, H,
                              K, budget, tok, dep, par, vis, fc, ns, nn, st);
  };
  for (int s = 0; s < sets; ++s)
    if (launch(s) != 0) { fprintf(stderr, "launch failed\n"); return 1; }
  CK(cudaStreamSynchronize(st));
  static long long zero[64][12];
  CK(cudaMemcpyToSymbol(g_lv_prof, zero, sizeof(zero)));
  const int reps = 16;
  for (int r = 0; r < reps; ++r) launch(r % sets);
  CK(cudaStreamSynchronize(st));
  long long prof[64][12];
  CK(cudaMemcpyFromSymbol(prof, g_lv_prof, sizeof(prof)));
  unsigned long long span[64][2];
  CK(cudaMemcpyFromSymbol(span, g_lv_span, sizeof(span)));
  std::vector<int64_t> nodes(B);
  CK(cudaMemcpy(nodes.data(), nn, B * 8, cudaMemcpyDeviceToHost));
  // Graph of 64 launches over the rotating inputs, replayed 20 times.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < 64; ++r) launch(r % sets);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int r = 0; r < 20; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1000.0f / 64);
  }
  std::sort(us.begin(), us.end());
  const int nb = std::min(B, 64);
  printf("{\"B\": %d, \"H\": %d, \"K\": %d, \"budget\": %d, \"scale\": %g, \"graph_us_median\": %.3f",
         B, H, K, budget, scale, us[us.size() / 2]);
  printf(", \"nodes_block0\": %lld", static_cast<long long>(nodes[0]));
  {  // the last launch: block start spread and first start -> last end (ns)
    unsigned long long s0 = ~0ull, s1 = 0, e1 = 0;
    for (int b = 0; b < std::min(B, 64); ++b) {
      s0 = std::min(s0, span[b][0]); s1 = std::max(s1, span[b][0]); e1 = std::max(e1, span[b][1]);
    }
    printf(", \"start_spread_ns\": %llu, \"span_ns\": %llu", s1 - s0, e1 - s0);
  }
  for (int p = 0; p < 11; ++p) {
    double mean = 0, mx = 0;
    for (int b = 0; b < nb; ++b) {
      const double v = double(prof[b][p]) / reps;
      mean += v / nb;
      mx = std::max(mx, v);
    }
    printf(", \"phase%d_mean\": %.1f, \"phase%d_max\": %.1f", p, mean, p, mx);
  }
  printf("}\n");
  return 0;
}
