// tree_verify_attention.cu: tree-verify MLA attention (absorbed form) over a paged KV cache.
//
// All heads of a request share its latent KV rows (MQA-like), so the (tree row, head) pairs of
// one request are the M rows of a GEMM against that request's KV: q is [total_q * heads, 576]
// row-major, and M row m of request b is q row qo_offsets[b] * heads + m (tree row m / heads).
// Per KV tile: S = Q K^T over 576 dims, online softmax in fp32 (exp2 domain), O += P V over
// the first 512 dims. The tree mask only touches key positions >= L_b (the last T_b keys).
// Long prefixes are split over CTAs (flash-decoding): each split writes O/l and log2-sum-exp
// to a workspace and a combine kernel merges them.
//
// Three kernels, chosen by the algo argument (DDTREE_ATTN_* in ddtree_attention.h):
//  - simt (fp32 FMA; float or bf16 storage): the fp32 path and a plain reference path.
//  - wgmma_tma (bf16, sm_90a only; tree_verify_attention_wgmma.cuh): the H100/H200 default.
//  - mma_sync (bf16, mma.sync m16n8k16 + ldmatrix + cp.async, sm_80+, identical on
//    sm_90/sm_120): warps form an (M/16) x 2 grid; warp (r, c) computes S for rows 16r.. and
//    keys of half c, the pair (r, 0)/(r, 1) exchange row maxima through shared memory, P goes
//    to shared memory. For PV, warp w takes all rows and value dims [512w/warps, +512/warps)
//    so V is read once per CTA; 128 fp32 accumulators a thread (the 512-wide value dim is
//    split across warps, never spilled).
//    Shared tiles are XOR-swizzled in 16-byte chunks so ldmatrix is conflict-free. The tile
//    is chosen from the device's opt-in shared memory: 64x64 with a double-buffered KV tile
//    (225 KiB: H100/H200 without an sm_90a build) or 32x32 single-buffered (75 KiB: sm_120).
// Variants retired after measurement are in benchmarks/NOTES-attention.md and git history.
#include <cuda.h>  // CUtensorMap (the wgmma kernel's TMA loads); types only, no -lcuda
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "ddtree_attention.h"

namespace {

constexpr int kQK = 576;            // key / query dims (512 latent + 64 rope)
constexpr int kV = 512;             // value dims
constexpr int kChunks = kQK / 8;    // 16-byte bf16 chunks per row (72)
constexpr float kLog2e = 1.4426950408889634f;

extern __shared__ __align__(128) unsigned char dyn_smem[];

struct Params {
  const void* q;
  const void* kv;
  const int32_t* block_table;
  const int32_t* prefix_lens;
  const int32_t* qo_offsets;
  const uint8_t* vis;
  void* out;
  float* part_o;    // [splits, total_rows, 512] (O / l of each split)
  float* part_lse;  // [splits, total_rows] (log2 sum exp2 of each split; -inf when empty)
  int heads, total_rows, t_max, page_size, max_pages, num_splits, tiles_per_split;
  float scale_log2;
  int tail_rows;  // wgmma kernel: CTAs with at most this many live rows (kWgTailRows) take the
                  // tail path (a runtime value: the kernel was tuned with it so)
  int kv_box_rows;  // wgmma kernel: KV rows a TMA box (a page or 64); 0 = cp.async loads
};

__device__ __forceinline__ int64_t kv_slot(const Params& p, int b, int pos) {
  const int page = p.block_table[static_cast<int64_t>(b) * p.max_pages + pos / p.page_size];
  return static_cast<int64_t>(page) * p.page_size + pos % p.page_size;
}

// Visibility of key position `pos` to tree row t of request b (prefix rows always visible).
__device__ __forceinline__ bool visible(const Params& p, int b, int t, int prefix, int kv_len,
                                        int pos) {
  if (pos >= kv_len) return false;
  if (pos < prefix) return true;
  return p.vis[(static_cast<int64_t>(b) * p.t_max + t) * p.t_max + (pos - prefix)] != 0;
}

template <typename T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

// Store the final normalised row values (or the split's partial) for M row `grow`.
template <typename T>
__device__ __forceinline__ void store_out(const Params& p, int split, int grow, int dim, float v) {
  if (p.num_splits == 1) {
    static_cast<T*>(p.out)[static_cast<int64_t>(grow) * kV + dim] = from_f<T>(v);
  } else {
    p.part_o[(static_cast<int64_t>(split) * p.total_rows + grow) * kV + dim] = v;
  }
}

// Tile range [begin, end) of this split; the last split takes every remaining tile, so the
// result never depends on the planning hint.
__device__ __forceinline__ void split_range(const Params& p, int n_tiles, int* begin, int* end,
                                            int split = -1) {
  if (split < 0) split = blockIdx.z;
  *begin = split * p.tiles_per_split;
  *end = split == p.num_splits - 1 ? n_tiles : min(n_tiles, *begin + p.tiles_per_split);
}

// ------------------------------------------------------------------------------ SIMT kernel
constexpr int kSimtM = 16, kSimtN = 16, kSimtThreads = 256, kSimtPad = kQK + 1;

template <typename T>
__global__ void __launch_bounds__(kSimtThreads) tva_simt_kernel(Params p) {
  float* qs = reinterpret_cast<float*>(dyn_smem);  // [16][577]
  float* ks = qs + kSimtM * kSimtPad;   // [16][577]
  float* ps = ks + kSimtN * kSimtPad;   // [16][16]
  float* row_m = ps + kSimtM * kSimtN;  // [16] running max (log2 units)
  float* row_l = row_m + kSimtM;        // [16] running sum
  float* row_a = row_l + kSimtM;        // [16] rescale factor of this tile
  // [16] element offset of each key row of the tile (-1 past kv_len): looked up once, in
  // parallel, so the tile's loads do not wait on 16 block-table reads one after another
  int64_t* kbase = reinterpret_cast<int64_t*>(row_a + kSimtM);
  const int b = blockIdx.y, tid = threadIdx.x;
  const int q0 = p.qo_offsets[b], t_b = p.qo_offsets[b + 1] - q0;
  const int rows_b = t_b * p.heads, m0 = blockIdx.x * kSimtM;
  if (m0 >= rows_b) return;
  const int prefix = p.prefix_lens[b], kv_len = prefix + t_b;
  int tile_begin, tile_end;
  split_range(p, (kv_len + kSimtN - 1) / kSimtN, &tile_begin, &tile_end);
  const T* q = static_cast<const T*>(p.q);
  const T* kv = static_cast<const T*>(p.kv);
  const int64_t row_base = static_cast<int64_t>(q0) * p.heads;
  for (int i = tid; i < kSimtM * kQK; i += kSimtThreads) {
    const int r = i / kQK, d = i % kQK;
    qs[r * kSimtPad + d] = m0 + r < rows_b ? to_f(q[(row_base + m0 + r) * kQK + d]) : 0.f;
  }
  if (tid < kSimtM) {
    row_m[tid] = -INFINITY;
    row_l[tid] = 0.f;
  }
  const int sr = tid >> 4, sn = tid & 15;  // score (row, key) of this thread; also O row
  const int t_row = min(m0 + sr, rows_b - 1) / p.heads;
  float o[kV / 16];
#pragma unroll
  for (int j = 0; j < kV / 16; ++j) o[j] = 0.f;
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int kv0 = tile * kSimtN;
    __syncthreads();  // previous tile's ks / ps reads are done
    if (tid < kSimtN) kbase[tid] = kv0 + tid < kv_len ? kv_slot(p, b, kv0 + tid) * kQK : -1;
    __syncthreads();
    for (int i = tid; i < kSimtN * kQK; i += kSimtThreads) {
      const int r = i / kQK, d = i % kQK;
      const int64_t base = kbase[r];
      ks[r * kSimtPad + d] = base >= 0 ? to_f(kv[base + d]) : 0.f;
    }
    __syncthreads();
    float s = 0.f;
    for (int d = 0; d < kQK; ++d) s = fmaf(qs[sr * kSimtPad + d], ks[sn * kSimtPad + d], s);
    ps[sr * kSimtN + sn] =
        visible(p, b, t_row, prefix, kv_len, kv0 + sn) ? s * p.scale_log2 : -INFINITY;
    __syncthreads();
    if (tid < 32 * (kSimtM / 2)) {  // warp w: rows 2w (lanes 0-15) and 2w+1 (lanes 16-31)
      const int r = tid >> 4;
      const float x = ps[r * kSimtN + sn];
      float mx = x;
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = row_m[r], m_new = fmaxf(m_old, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float e = exp2f(x - m_use);
      float sum = e;
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();
      ps[r * kSimtN + sn] = e;
      if (sn == 0) {
        const float alpha = exp2f(m_old - m_use);
        row_a[r] = alpha;
        row_l[r] = row_l[r] * alpha + sum;
        row_m[r] = m_new;
      }
    }
    __syncthreads();
    const float alpha = row_a[sr];
#pragma unroll
    for (int j = 0; j < kV / 16; ++j) o[j] *= alpha;
    for (int n = 0; n < kSimtN; ++n) {
      const float w = ps[sr * kSimtN + n];
#pragma unroll
      for (int j = 0; j < kV / 16; ++j) o[j] = fmaf(w, ks[n * kSimtPad + sn + 16 * j], o[j]);
    }
  }
  __syncthreads();
  if (m0 + sr >= rows_b) return;
  const float l = row_l[sr];
  const float inv = l > 0.f ? 1.f / l : 0.f;
  const int grow = static_cast<int>(row_base) + m0 + sr;
#pragma unroll
  for (int j = 0; j < kV / 16; ++j) store_out<T>(p, blockIdx.z, grow, sn + 16 * j, o[j] * inv);
  if (p.num_splits > 1 && sn == 0)
    p.part_lse[static_cast<int64_t>(blockIdx.z) * p.total_rows + grow] =
        l > 0.f ? row_m[sr] + log2f(l) : -INFINITY;
}

// ------------------------------------------------------------------------------ MMA kernel
#include "tree_verify_attention_mma.cuh"

// ------------------------------------------------------------------------------ wgmma (sm_90a)
#include "tree_verify_attention_wgmma.cuh"

// ------------------------------------------------------------------------------ combine
template <typename T>
__global__ void __launch_bounds__(128) tva_combine_kernel(Params p) {
  const int row = blockIdx.x;
  float lse_max = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s)
    lse_max = fmaxf(lse_max, p.part_lse[static_cast<int64_t>(s) * p.total_rows + row]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, wsum = 0.f;
  const int d = threadIdx.x * 4;
  for (int s = 0; s < p.num_splits; ++s) {
    const float lse = p.part_lse[static_cast<int64_t>(s) * p.total_rows + row];
    if (lse == -INFINITY) continue;  // empty split (or one that saw no visible key)
    const float w = exp2f(lse - lse_max);
    wsum += w;
    const float4 v = *reinterpret_cast<const float4*>(
        p.part_o + (static_cast<int64_t>(s) * p.total_rows + row) * kV + d);
    acc[0] = fmaf(w, v.x, acc[0]);
    acc[1] = fmaf(w, v.y, acc[1]);
    acc[2] = fmaf(w, v.z, acc[2]);
    acc[3] = fmaf(w, v.w, acc[3]);
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  T* out = static_cast<T*>(p.out) + static_cast<int64_t>(row) * kV + d;
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = from_f<T>(acc[i] * inv);
}

// ------------------------------------------------------------------------------ host side
struct Launch {
  int bm, bn, threads, smem, ctas_per_sm;
  const void* kernel;
  bool tma = false;   // the wgmma kernel: the KV tensor map (2nd kernel parameter) is encoded
  bool tail = false;  // the wgmma kernel: CTAs with <= kWgTailRows live rows take the tail path
};

int device_info(int* sms, int* smem_optin) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return static_cast<int>(e);
}

template <int BM, int BN, int STAGES, int NC, int MINB>
Launch mma_variant() {
  using C = MmaCfg<BM, BN, STAGES, NC, MINB>;
  return {BM, BN, C::kThreads, C::kSmem, MINB,
          reinterpret_cast<const void*>(&tva_mma_kernel<BM, BN, STAGES, NC, MINB>)};
}
Launch wgmma_tma() {
  return {kWgBM, kWgBN, kWgThreads, kWgSmem, 1, reinterpret_cast<const void*>(&tva_wgmma_kernel),
          true, true};
}
// The mma.sync tiles: 64x64 (8 warps, KV double-buffered, 225 KiB: H100/H200) and 32x32 (4
// warps, 75 KiB: fits sm_120's 99 KiB). auto takes the first of wgmma_tma, mma_sync_64,
// mma_sync_32 that is launchable and fits the device's opt-in shared memory. H200 sweeps
// 2026-11-29 (benchmarks/NOTES-attention.md): wgmma_tma beat mma_sync_64 by 40-45% at the
// target sizes (B64 x 4096: 0.850 ms; B8 x 32768: 0.779-0.797 ms); mma_sync_32 is unmeasured
// on sm_120. With pages TMA cannot take (sizes other than 16, 32 or a multiple of 64)
// wgmma_tma loads with cp.async, issued after the QK.
Launch mma_sync_64() { return mma_variant<64, 64, 2, 2, 1>(); }
Launch mma_sync_32() { return mma_variant<32, 32, 1, 2, 1>(); }

// Whether this build holds real code of l's kernel for the current device: the wgmma kernel is
// a stub with __launch_bounds__(32) wherever it was not compiled for sm_90a.
bool launchable(const Launch& l) {
  cudaFuncAttributes a;
  if (cudaFuncGetAttributes(&a, l.kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.maxThreadsPerBlock >= l.threads;
}

// The launch of algo for dtype on the current device: auto = the first tensor-core kernel that
// runs here (bf16), simt (fp32). A forced algo the device cannot run is an error.
int choose(int dtype, int algo, Launch* l) {
  if (algo < DDTREE_ATTN_AUTO || algo > DDTREE_ATTN_WGMMA_TMA)
    return static_cast<int>(cudaErrorInvalidValue);
  int sms = 0, optin = 0;
  if (int e = device_info(&sms, &optin)) return e;
  const bool mma = algo == DDTREE_ATTN_AUTO ? dtype == DDTREE_ATTN_BFLOAT16
                                            : algo != DDTREE_ATTN_SIMT;
  if (mma && dtype != DDTREE_ATTN_BFLOAT16) return static_cast<int>(cudaErrorInvalidValue);
  if (!mma) {
    const int smem = (2 * 16 * kSimtPad + 16 * 16 + 3 * 16) * 4 + kSimtN * 8;
    *l = {kSimtM, kSimtN, kSimtThreads, smem, 2,
          dtype == DDTREE_ATTN_FLOAT32 ? reinterpret_cast<const void*>(&tva_simt_kernel<float>)
                                       : reinterpret_cast<const void*>(
                                             &tva_simt_kernel<__nv_bfloat16>)};
  } else if (algo != DDTREE_ATTN_AUTO) {
    *l = algo == DDTREE_ATTN_WGMMA_TMA   ? wgmma_tma()
         : algo == DDTREE_ATTN_MMA_SYNC_64 ? mma_sync_64()
                                           : mma_sync_32();
    if (!launchable(*l)) return static_cast<int>(cudaErrorInvalidDeviceFunction);
  } else {
    for (const Launch& c : {wgmma_tma(), mma_sync_64(), mma_sync_32()}) {
      *l = c;
      if (l->smem <= optin && launchable(*l)) break;
    }
  }
  if (l->smem > optin) return static_cast<int>(cudaErrorInvalidConfiguration);
  return 0;
}

// Greedy makespan, in KV tiles, of `full` CTAs of tps tiles each followed by `tails` CTAs of u
// tiles on `slots` SMs (the block order with the tail CTAs after every full one): after the
// whole waves, the slots the last partial wave leaves free take tails at once, the others when
// their full CTA ends.
double makespan(int64_t full, int64_t tails, int slots, double tps, double u) {
  const int64_t q = full / slots, r = full % slots, a = slots - r;
  const double base = static_cast<double>(q) * tps, busy = r ? tps : 0.0;
  if (tails == 0) return base + busy;
  auto done = [&](double x) {  // tails finished by base + x
    return a * static_cast<int64_t>(floor(x / u + 1e-9)) +
           (x > tps ? r * static_cast<int64_t>(floor((x - tps) / u + 1e-9)) : 0);
  };
  auto first = [&](double off) {  // the smallest x = off + k u with done(x) >= tails
    int64_t lo = off > 0 ? 0 : 1, hi = tails;  // done(off + tails u) >= a tails >= tails
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (done(off + static_cast<double>(mid) * u) >= tails) hi = mid;
      else lo = mid + 1;
    }
    return off + static_cast<double>(lo) * u;
  };
  return base + fmax(busy, fmin(first(0.0), first(tps)));
}

// Split count: minimise (waves x tiles a split) plus the combine pass, in KV-tile units. With
// the wgmma kernel's tail path (scheduled last) and t_max x heads leaving at most
// kWgTailRows rows in the last M tile, the tail CTAs are counted apart at kTailWeight of a
// full CTA's time, placed by makespan() into the idle slots of the last wave, and a split
// costs kTailSplit instead of 4000 rows a KV tile. Fitted to wgmma_tma on an H200 (run v8,
// benchmarks/NOTES-attention.md): the plain count picked 2 splits at B64 x 4096 x T65, where 1
// measured 2.6% faster, and 3 at B16 x 1024 x T33, where 1 measured 4% faster; the other
// measured best picks are unchanged.
constexpr double kTailWeight = 0.75, kTailSplit = 2000.0;
int plan_splits(const Launch& l, int sms, int batch, int heads, int t_max, int max_kv_len) {
  const int m_tiles = (t_max * heads + l.bm - 1) / l.bm;
  const bool tail = l.tail && t_max * heads - (m_tiles - 1) * l.bm <= kWgTailRows;
  const int64_t tails = tail ? batch : 0, full = static_cast<int64_t>(batch) * m_tiles - tails;
  const double split_rows = tail ? kTailSplit : 4000.0;  // rows a KV tile a split costs
  const int tiles = (max(max_kv_len, 1) + l.bn - 1) / l.bn;
  const int slots = max(1, sms * l.ctas_per_sm);
  const double rows = static_cast<double>(batch) * t_max * heads;
  int best = 1;
  double best_cost = 1e300;
  for (int s = 1; s <= min(tiles, 128); ++s) {
    const int tps = (tiles + s - 1) / s;  // without tails: whole waves x tps
    const double cost = makespan(full * s, tails * s, slots, tps, kTailWeight * tps) *
                            (l.bm * l.bn) / 4096.0 +
                        (s > 1 ? s * rows / split_rows : 0);
    if (cost < best_cost * 0.999) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

// KV rows a TMA box for this page size: a 64-key tile is one box (pages of a multiple of 64
// rows) or 2-4 whole pages (16 or 32 rows); 0 = other sizes, which keep the cp.async loads.
int tma_box_rows(int page_size) {
  if (page_size % 64 == 0) return 64;
  return page_size >= 16 && 64 % page_size == 0 ? page_size : 0;
}

// The wgmma kernel's tensor map: the KV cache as a 2-D bf16 tensor [slots, 576] (row stride 1152
// bytes), boxes of [box rows, 64 dims] written with the 128-byte swizzle of wg_off. The slot
// count is not passed in, so the outer extent is the largest the map takes; boxes start at page
// starts from the block table and never run past a page. cuTensorMapEncodeTiled comes through
// the runtime's driver entry point (no link against libcuda).
int encode_kv_map(Params* p, CUtensorMap* map, const void* kv, int page_size) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                              const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                              const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<Encode>(nullptr);
    }
    return reinterpret_cast<Encode>(fn);
  }();
  const int rows = tma_box_rows(page_size);
  if (rows == 0) return 0;  // the cp.async path
  if (encode == nullptr) return static_cast<int>(cudaErrorNotSupported);
  const cuuint64_t dim[2] = {kQK, 0x7fffffffu}, stride[1] = {kQK * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(rows)}, elem[2] = {1, 1};
  if (encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(kv), dim, stride,
             box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return static_cast<int>(cudaErrorInvalidValue);
  p->kv_box_rows = rows;
  return 0;
}

size_t workspace_for(int splits, int total_rows) {
  return splits > 1 ? static_cast<size_t>(splits) * total_rows * (kV + 1) * sizeof(float) : 0;
}

bool bad_dims(int dtype, int batch, int heads, int total_q, int t_max) {
  return (dtype != DDTREE_ATTN_FLOAT32 && dtype != DDTREE_ATTN_BFLOAT16) || batch < 0 ||
         heads < 1 || heads > 128 || total_q < 0 || t_max < 1 ||
         static_cast<int64_t>(total_q) * heads * (kV + 1) > (int64_t{1} << 31);
}

}  // namespace

extern "C" const char* ddtree_attention_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

extern "C" int ddtree_tree_verify_attention_plan(int dtype, int algo, int batch, int heads,
                                                 int total_q, int t_max, int max_kv_len,
                                                 int num_splits_req, int* num_splits,
                                                 size_t* workspace_bytes) {
  if (!num_splits || !workspace_bytes || bad_dims(dtype, batch, heads, total_q, t_max) ||
      num_splits_req < 0 || num_splits_req > 1024)
    return static_cast<int>(cudaErrorInvalidValue);
  Launch l;
  if (int e = choose(dtype, algo, &l)) return e;
  int sms = 0, optin = 0;
  if (int e = device_info(&sms, &optin)) return e;
  const int s =
      num_splits_req > 0 ? num_splits_req : plan_splits(l, sms, batch, heads, t_max, max_kv_len);
  *num_splits = s;
  *workspace_bytes = workspace_for(s, total_q * heads);
  return 0;
}

extern "C" int ddtree_tree_verify_attention(
    const void* q, const void* kv_cache, const int32_t* block_table, const int32_t* prefix_lens,
    const int32_t* qo_offsets, const uint8_t* visibility, void* out, void* workspace,
    size_t workspace_bytes, int dtype, int algo, int batch, int heads, int total_q, int t_max,
    int page_size, int max_pages, int max_kv_len, float scale, int num_splits,
    cudaStream_t stream) {
  if (bad_dims(dtype, batch, heads, total_q, t_max) || page_size < 1 || max_pages < 1 ||
      num_splits < 1 || num_splits > 1024)
    return static_cast<int>(cudaErrorInvalidValue);
  if (batch == 0 || total_q == 0) return 0;
  if (!q || !kv_cache || !block_table || !prefix_lens || !qo_offsets || !visibility || !out ||
      ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(kv_cache) |
        reinterpret_cast<uintptr_t>(out)) & 15))
    return static_cast<int>(cudaErrorInvalidValue);
  Launch l;
  if (int e = choose(dtype, algo, &l)) return e;
  const int total_rows = total_q * heads;
  if (workspace_bytes < workspace_for(num_splits, total_rows) || (num_splits > 1 && !workspace))
    return static_cast<int>(cudaErrorInvalidValue);
  const int max_tiles = (max(max_kv_len, 1) + l.bn - 1) / l.bn;
  Params p{q, kv_cache, block_table, prefix_lens, qo_offsets, visibility, out,
           static_cast<float*>(workspace),
           num_splits > 1 ? static_cast<float*>(workspace) +
                                static_cast<size_t>(num_splits) * total_rows * kV
                          : nullptr,
           heads, total_rows, t_max, page_size, max_pages, num_splits,
           (max_tiles + num_splits - 1) / num_splits, scale * kLog2e, kWgTailRows};
  CUtensorMap kv_map{};  // the wgmma kernel's second parameter
  if (l.tma) {  // a map the driver refuses: an error when forced, cp.async loads in auto mode
    const int e = encode_kv_map(&p, &kv_map, kv_cache, page_size);
    if (e && algo == DDTREE_ATTN_WGMMA_TMA) return e;
  }
  if (cudaError_t e = cudaFuncSetAttribute(l.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           l.smem))
    return static_cast<int>(e);
  const dim3 grid((t_max * heads + l.bm - 1) / l.bm, batch, num_splits);
  void* args[] = {&p, &kv_map};  // kernels with one parameter read only the first
  if (cudaError_t e = cudaLaunchKernel(l.kernel, grid, dim3(l.threads), args, l.smem, stream))
    return static_cast<int>(e);
  if (num_splits > 1) {
    if (dtype == DDTREE_ATTN_FLOAT32)
      tva_combine_kernel<float><<<total_rows, 128, 0, stream>>>(p);
    else
      tva_combine_kernel<__nv_bfloat16><<<total_rows, 128, 0, stream>>>(p);
  }
  return static_cast<int>(cudaGetLastError());
}
