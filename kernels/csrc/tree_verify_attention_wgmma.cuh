// tree_verify_attention_wgmma.cuh: the Hopper (sm_90a) attention kernel, wgmma with TMA KV loads.
// Included by tree_verify_attention.cu inside its anonymous namespace (uses Params, kv_slot,
// visible, split_range, cp_async16, smem_u32 from there).
//
// One CTA = 64 M rows x 64-key tiles, two warpgroups (256 threads), like the 64-row mma.sync
// kernel but with the operands read by the tensor cores straight from shared memory (no
// ldmatrix):
//  - QK: warpgroup w computes S[64 rows, keys 32w..+32) = Q K^T with 36 wgmma m64n32k16
//    (A = Q, B = K, both K-major, 128-byte swizzle);
//  - the two warpgroups exchange row maxima through shared memory (thread (warp % 4, lane)
//    holds the same two rows in both), P = exp2(S - m) goes to shared memory as bf16;
//  - PV: warpgroup w accumulates O[64 rows, dims 256w..+256) += P V with V MN-major
//    (transposed B) from the same KV tile as one m64n256k16 a 16-key step; 128 fp32
//    accumulators a thread.
// KV loads: by TMA where the page size allows (see the kernel's comment), else cp.async.
// Variants retired after measurement are in benchmarks/NOTES-attention.md and git history.
// Tail path (wg_tail, below): a CTA with at most p.tail_rows (8) live rows swaps the products
// (S^T = K Q^T, O^T += V^T P^T with m64n8k16) instead of spending a 64-row tile on them.
// Shared tiles are stored "k-block major": [576 / 64 blocks][rows][64 bf16] with the 16-byte
// chunk index XOR (row % 8), i.e. the canonical 128B-swizzle layout of both GMMA majors.
// Built only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL). Elsewhere the kernel is an empty stub with
// __launch_bounds__(32): the host sees maxThreadsPerBlock < 256 and never launches it.
#pragma once

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TVA_WG_REAL 1
#define TVA_WG_BOUND 256
#elif defined(__CUDA_ARCH__)
#define TVA_WG_REAL 0
#define TVA_WG_BOUND 32
#else
#define TVA_WG_REAL 0
#define TVA_WG_BOUND 256
#endif

constexpr int kWgThreads = 256, kWgBM = 64, kWgBN = 64;
constexpr int kWgTailRows = 8;  // CTAs with at most this many live rows take the tail path
constexpr int kWgTile = 64 * kQK * 2;                   // Q tile or one KV stage (72 KiB)
constexpr int kWgP = kWgBM * kWgBN * 2, kWgRed = 4 * kWgBM * 4;
constexpr int kWgBars = 64;  // the TMA loads' two mbarriers (one a KV stage)
constexpr int kWgSmem = 3 * kWgTile + kWgP + kWgRed + kWgBars + 1024;  // + 1024: alignment

#if TVA_WG_REAL
// Byte offset of 16-byte chunk c (0..71) of row r in a k-block-major swizzled 64-row tile.
__device__ __forceinline__ uint32_t wg_off(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
// TMA loads: zero the V rows valid..63 of a KV stage (generic address kv_g), which a box
// carries in from past the request's end (0 x NaN would poison O), by `nthreads` threads.
__device__ __forceinline__ void wg_zero_dead_rows(unsigned char* kv_g, int valid, int nthreads) {
  for (int i = threadIdx.x; i < (kWgBN - valid) * (kV / 8); i += nthreads)
    *reinterpret_cast<uint4*>(kv_g + wg_off(valid + (i >> 6), i & 63)) = make_uint4(0, 0, 0, 0);
}
// GMMA shared-memory descriptor, 128-byte swizzle (layout type 1).
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_n32_kk(float* d, uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}
__device__ __forceinline__ void wgmma_n256_kt(float* d, uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}

// mbarrier and TMA (the KV loads: thread 0 issues 9 bulk tensor copies a 64-key
// page, the copy engine writes the 128B-swizzled layout of wg_off and completes the stage's
// mbarrier with the byte count).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra.uni WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// L2 prefetch of a contiguous global range (the TMA loader's look-ahead a tile past the stages).
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// m64n8k16 with B K-major; A K-major (TA 0, tail path: S^T = K Q^T) or MN-major (TA 1:
// V^T straight from the KV tile, tail path: O^T += V^T P^T).
template <int TA>
__device__ __forceinline__ void wgmma_n8(float* d, uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(scale_d), "n"(TA)
      : "memory");
}

#endif  // TVA_WG_REAL

#if TVA_WG_REAL
// One 64-key KV tile of request b into the stage at dst (cp.async; 4 threads a key row, 18
// 16-byte chunks each; keys past kv_len zero-filled): the main loop's and the tail path's loads.
__device__ __forceinline__ void wg_load_kv(const Params& p, int b, int kv_len, int tile,
                                           uint32_t dst) {
  const int tid = threadIdx.x, r = tid >> 2, sub = tid & 3, pos = tile * kWgBN + r;
  const bool ok = pos < kv_len;
  const __nv_bfloat16* kvg = static_cast<const __nv_bfloat16*>(p.kv);
  const __nv_bfloat16* src = ok ? kvg + kv_slot(p, b, pos) * kQK : kvg;
#pragma unroll
  for (int c = sub; c < kChunks; c += 4) cp_async16(dst + wg_off(r, c), src + (ok ? c * 8 : 0), ok);
}

// The tail path: a CTA with at most 8 live rows (rows_b - m0 <= 8). A 64-row wgmma tile would
// spend 7/8 of its tensor work on dead rows, so the product is swapped: warpgroup 0 computes
// S^T[64 keys, 8 rows] = K Q^T with 36 m64n8k16 (A = the KV tile, B = the 8 Q rows, both
// K-major, the layouts of the main path), takes the softmax down the columns (row maxima: quad
// shuffles over the keys, then the 4 warps through shared memory and named barrier 1), and
// writes P [8 rows][64 keys]; then both warpgroups accumulate O^T[512 dims, 8 rows] += V^T P^T
// with m64n8k16 (A = V MN-major, straight from the KV tile; B = P, K-major), 4 dim blocks of 64
// each. Accumulators: S^T element e of this thread is key 16 wr + g (+8 for e >= 2) and row
// 2 qd + (e & 1); O^T block mt likewise with dims (4 wg + mt) 64 + 16 wr + g (+8).
// KV tiles double-buffered as in the main path: by cp.async, or, when use_tma, by TMA: thread
// 0 calls tma_first() for the first tile and tma_next(tile, stage) for tile + 1 (into stage ^
// 1) after the loop-top barrier, everyone waits on the stage's mbarrier (bar_u + 8 stage), and
// the dead rows a box carries in past kv_len are zeroed (through kvs_g, the stages' generic
// address) before the PV.
template <class First, class Next>
__device__ __forceinline__ void wg_tail(const Params& p, int b, int m0, int split, int rows_b,
                                        int prefix, int kv_len, int tile_begin, int tile_end,
                                        uint32_t qs_u, uint32_t kvs_u, uint32_t ps_u,
                                        unsigned char* ps, float* red_max, float* red_sum,
                                        bool use_tma, uint32_t bar_u, unsigned char* kvs_g,
                                        const First& tma_first, const Next& tma_next) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wr = warp & 3, g = lane >> 2, qd = lane & 3;
  const int live = rows_b - m0;  // 1..8
  const int q0 = p.qo_offsets[b];
  const int64_t row_base = static_cast<int64_t>(q0) * p.heads;
  const __nv_bfloat16* qg = static_cast<const __nv_bfloat16*>(p.q);
  float* row_alpha = red_max + 4 * 8;  // [8]; red_max[0..32): [warp][row] maxima
  auto load_kv = [&](int tile, int stage) { wg_load_kv(p, b, kv_len, tile, kvs_u + stage * kWgTile); };
  if (tile_begin < tile_end) {
    for (int i = tid; i < 8 * kChunks; i += kWgThreads) {  // Q rows 0..7 (dead ones zero)
      const int r = i / kChunks, c = i - r * kChunks;
      const bool ok = r < live;
      cp_async16(qs_u + wg_off(r, c), ok ? qg + (row_base + m0 + r) * kQK + c * 8 : qg, ok);
    }
    if (!use_tma) load_kv(tile_begin, 0);
    else if (tid == 0) tma_first();
    cp_async_commit();
  }
  const int k0 = 16 * wr + g, r0 = 2 * qd;  // this thread's keys k0, k0 + 8; rows r0, r0 + 1
  int t_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) t_row[h] = min(m0 + r0 + h, rows_b - 1) / p.heads;
  float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.f, 0.f};
  float o[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i] = 0.f;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = (tile - tile_begin) & 1;
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    if (use_tma) {  // the barrier freed stage ^ 1 (every PV of the last tile is done)
      if (tid == 0 && tile + 1 < tile_end) tma_next(tile, stage);
      mbar_wait(bar_u + 8 * stage, ((tile - tile_begin) >> 1) & 1);
    } else if (tile + 1 < tile_end) {
      load_kv(tile + 1, stage ^ 1);
      cp_async_commit();
    }
    const uint32_t kv_u = kvs_u + stage * kWgTile;
    const int kv0 = tile * kWgBN;
    if (wg == 0) {
      // Four independent accumulator chains (k-step kk into chain kk % 4): one chain of 36
      // dependent m64n8k16 would wait out each one's latency (measured: the tail CTA then
      // cost about as much as a full one).
      float sc[4][4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sc[c][e] = 0.f;
          asm volatile("" : "+f"(sc[c][e]));  // defined here, not between the wgmmas
        }
      }
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kQK / 16; ++kk) {
        const uint32_t koff = (kk >> 2) * 8192 + (kk & 3) * 32;
        wgmma_n8<0>(sc[kk & 3], wg_desc(kv_u + koff, 16, 1024), wg_desc(qs_u + koff, 16, 1024),
                    1);
      }
      wg_commit();
      wg_wait0();
      float sa[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) sa[e] = (sc[0][e] + sc[1][e]) + (sc[2][e] + sc[3][e]);
      const bool need_mask = kv0 + kWgBN > prefix;
      float sv[4], mx[2];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e & 1, pos = kv0 + k0 + (e >> 1) * 8;
        float x = sa[e] * p.scale_log2;
        if (r0 + h >= live || (need_mask && !visible(p, b, t_row[h], prefix, kv_len, pos)))
          x = -INFINITY;
        sv[e] = x;
      }
      mx[0] = fmaxf(sv[0], sv[2]);
      mx[1] = fmaxf(sv[1], sv[3]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int o2 = 4; o2 < 32; o2 <<= 1)
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o2));
      }
      if (g == 0) {
        red_max[wr * 8 + r0] = mx[0];
        red_max[wr * 8 + r0 + 1] = mx[1];
      }
      asm volatile("bar.sync 1, 128;\n" ::: "memory");
      if (use_tma && kv_len - kv0 < kWgBN)  // the QKs are done with K
        wg_zero_dead_rows(kvs_g + stage * kWgTile, kv_len - kv0, 128);
      float m_use[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m_new = m_run[h];
#pragma unroll
        for (int w = 0; w < 4; ++w) m_new = fmaxf(m_new, red_max[w * 8 + r0 + h]);
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m_run[h] - m_use[h]);
        m_run[h] = m_new;
        l_part[h] *= alpha;
        if (wr == 0 && g == 0) row_alpha[r0 + h] = alpha;
      }
      // P[row][key] (bf16), [8 rows][64 keys] swizzled: the K-major B operand of the PV.
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e & 1, key = k0 + (e >> 1) * 8, row = r0 + h;
        const float pv = exp2f(sv[e] - m_use[h]);
        l_part[h] += pv;
        *reinterpret_cast<__nv_bfloat16*>(ps + row * 128 + (((key >> 3) ^ (row & 7)) << 4) +
                                          (key & 7) * 2) = __float2bfloat16_rn(pv);
      }
    }
    fence_proxy_async();  // P stores (generic proxy) -> wgmma reads
    __syncthreads();
    const float a0 = row_alpha[r0], a1 = row_alpha[r0 + 1];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      o[i] *= i & 1 ? a1 : a0;
      asm volatile("" : "+f"(o[i]));  // rescaled before the fence, not between the wgmmas
    }
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kWgBN / 16; ++ks) {
      const uint64_t db = wg_desc(ps_u + ks * 32, 16, 1024);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
        wgmma_n8<1>(o + 4 * mt, wg_desc(kv_u + (wg * 4 + mt) * 8192 + ks * 2048, 1024, 1024), db,
                    1);
    }
    wg_commit();
    wg_wait0();
  }

  // Row sums: over this warp's keys (lanes with the same qd), then the 4 warps of warpgroup 0.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) l_part[h] += __shfl_xor_sync(0xffffffffu, l_part[h], o2);
  }
  __syncthreads();
  if (wg == 0 && g == 0) {
    red_sum[wr * 8 + r0] = l_part[0];
    red_sum[wr * 8 + r0 + 1] = l_part[1];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + h;
    if (row >= live) continue;
    const float l = red_sum[row] + red_sum[8 + row] + red_sum[16 + row] + red_sum[24 + row];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t grow = row_base + m0 + row;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
      for (int dd = 0; dd < 2; ++dd) {
        const int dim = (wg * 4 + mt) * 64 + k0 + 8 * dd;
        const float v = o[4 * mt + 2 * dd + h] * inv;
        if (p.num_splits == 1)
          static_cast<__nv_bfloat16*>(p.out)[grow * kV + dim] = __float2bfloat16_rn(v);
        else
          p.part_o[(static_cast<int64_t>(split) * p.total_rows + grow) * kV + dim] = v;
      }
    }
    if (p.num_splits > 1 && wg == 0 && wr == 0 && g == 0)
      p.part_lse[static_cast<int64_t>(split) * p.total_rows + grow] =
          l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
  }
}
#endif  // TVA_WG_REAL

// Choices measured on an H200 and kept (benchmarks/NOTES-attention.md):
//  - PV as one m64n256k16 a 16-key step (the 4 dim blocks are LBO = 8192 bytes apart);
//  - the next tile's loads are issued after the QK wgmmas, so the page-table lookup and the
//    loads overlap the tensor work instead of delaying it;
//  - a warp skips the O rescale when every alpha it holds is 1 (x * 1.0f == x: bit-identical);
//  - the KV tiles come by TMA (p.kv_box_rows > 0: pages of 16, 32 or a multiple of 64 rows;
//    else the cp.async path): thread 0 issues a tile's boxes (their page slots looked up a tile
//    ahead, walking the pages a tile at a time instead of dividing each box's position by the
//    page size) and every thread waits on the stage's mbarrier; rows past the request's end,
//    which a box may carry in from its page, are zeroed before the PV (0 x NaN would poison
//    O). The loop-top barrier comes before the wait for this tile's KV, so thread 0 issues the
//    next tile's boxes as soon as the stage is free, and prefetches the pages of the tile
//    after next into L2 (a third stage in L2 rather than shared memory, which has no room for
//    one). The tail path's KV tiles come by TMA too.
__global__ void __launch_bounds__(TVA_WG_BOUND, 1) tva_wgmma_kernel(Params p, const __grid_constant__ CUtensorMap kv_map) {
#if TVA_WG_REAL
  const uint32_t base = (smem_u32(dyn_smem) + 1023u) & ~1023u;
  const uint32_t qs_u = base, kvs_u = base + kWgTile, ps_u = base + 3 * kWgTile;
  unsigned char* gbase = dyn_smem + (base - smem_u32(dyn_smem));
  unsigned char* ps = gbase + 3 * kWgTile;
  float* red_max = reinterpret_cast<float*>(ps + kWgP);  // [2][64]
  float* red_sum = red_max + 2 * kWgBM;                  // [2][64]

  // Block order: the grid's last M column (where the few-row tails are) is scheduled after
  // every other CTA, so its short CTAs fill the last wave's idle SMs.
  int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
  if (gridDim.x > 1) {
    const int gx = gridDim.x, gy = gridDim.y;
    const int lin = blockIdx.x + gx * (blockIdx.y + gy * blockIdx.z);
    const int n_full = (gx - 1) * gy * static_cast<int>(gridDim.z);
    if (lin < n_full) {
      bx = lin % (gx - 1);
      by = (lin / (gx - 1)) % gy;
      bz = lin / (gx - 1) / gy;
    } else {
      bx = gx - 1;
      by = (lin - n_full) % gy;
      bz = (lin - n_full) / gy;
    }
  }
  const int b = by, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wr = warp & 3;  // warpgroup (key half / dim half), row group
  const int q0 = p.qo_offsets[b], t_b = p.qo_offsets[b + 1] - q0;
  const int rows_b = t_b * p.heads, m0 = bx * kWgBM;
  if (m0 >= rows_b) return;
  const int prefix = p.prefix_lens[b], kv_len = prefix + t_b;
  int tile_begin, tile_end;
  split_range(p, (kv_len + kWgBN - 1) / kWgBN, &tile_begin, &tile_end, bz);
  const int64_t row_base = static_cast<int64_t>(q0) * p.heads;
  const __nv_bfloat16* kvg = static_cast<const __nv_bfloat16*>(p.kv);
  auto more = [&](int tile) { return tile + 1 < tile_end; };

  auto load_kv = [&](int tile, int stage) { wg_load_kv(p, b, kv_len, tile, kvs_u + stage * kWgTile); };
  // TMA loads: the stages' mbarriers, and thread 0's page slots of the next tile's boxes.
  const bool use_tma = p.kv_box_rows > 0;
  const uint32_t bar_u = ps_u + kWgP + kWgRed;
  int next_slot[4] = {0, 0, 0, 0};
  // The page index and row offset of the next tile tma_slots is asked for (it is asked for
  // tile_begin, tile_begin + 1, ... in order); set from tile_begin with one division.
  int walk_pg = 0, walk_off = 0;
  if (use_tma && tid == 0) {
    walk_pg = tile_begin * kWgBN / p.page_size;
    walk_off = tile_begin * kWgBN - walk_pg * p.page_size;
  }
  auto tma_slots = [&](int tile) {  // thread 0: the slots of tile's boxes (looked up early)
    const int32_t* bt = p.block_table + static_cast<int64_t>(b) * p.max_pages;
    const int rows = p.kv_box_rows;  // 64 (pages of a multiple of 64 rows), 32 or 16
    if (rows == kWgBN) {  // one box: rows walk_off.. of page walk_pg
      if (tile * kWgBN < kv_len) next_slot[0] = bt[walk_pg] * p.page_size + walk_off;
      walk_off += kWgBN;
      if (walk_off == p.page_size) {
        walk_off = 0;
        ++walk_pg;
      }
    } else {  // one box a page, 2 or 4 pages a tile
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j * rows < kWgBN && tile * kWgBN + j * rows < kv_len)
          next_slot[j] = bt[walk_pg + j] * p.page_size;
      }
      walk_pg += rows == 32 ? 2 : 4;
    }
  };
  auto tma_prefetch = [&](int tile) {  // thread 0: tile's pages into L2 (after tma_slots(tile))
    const int rows = p.kv_box_rows, valid = min(kWgBN, kv_len - tile * kWgBN);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j * rows >= valid) break;
      prefetch_l2(kvg + static_cast<int64_t>(next_slot[j]) * kQK, rows * kQK * 2);
    }
  };
  auto tma_issue = [&](int tile, int stage) {  // thread 0: the boxes of tile into stage
    const int rows = p.kv_box_rows, valid = min(kWgBN, kv_len - tile * kWgBN);
    const int boxes = rows == kWgBN ? 1 : (valid + rows - 1) >> (rows == 32 ? 5 : 4);
    const uint32_t bar = bar_u + 8 * stage, dst = kvs_u + stage * kWgTile;
    mbar_expect_tx(bar, static_cast<uint32_t>(boxes * rows * kQK * 2));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j >= boxes) break;
#pragma unroll
      for (int c = 0; c < kQK / 64; ++c)
        tma_load_2d(dst + c * 8192 + j * rows * 128, &kv_map, c * 64, next_slot[j], bar);
    }
  };
  auto tma_first = [&]() {  // thread 0: the first tile's boxes, then look ahead
    tma_slots(tile_begin);
    tma_issue(tile_begin, 0);
    if (more(tile_begin)) tma_slots(tile_begin + 1);
  };
  auto tma_advance = [&](int tile, int stage) {  // thread 0: tile + 1 into stage ^ 1, look ahead
    tma_issue(tile + 1, stage ^ 1);
    if (more(tile + 1)) {
      tma_slots(tile + 2);
      tma_prefetch(tile + 2);
    }
  };
  if (use_tma && tid == 0) {
    mbar_init(bar_u, 1);
    mbar_init(bar_u + 8, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (rows_b - m0 <= p.tail_rows) {
    wg_tail(p, b, m0, bz, rows_b, prefix, kv_len, tile_begin, tile_end, qs_u, kvs_u, ps_u, ps,
            red_max, red_sum, use_tma, bar_u, gbase + kWgTile, tma_first, tma_advance);
    return;
  }
  if (tile_begin < tile_end) {
    const int r = tid >> 2, sub = tid & 3;
    const bool ok = m0 + r < rows_b;
    const __nv_bfloat16* src =
        static_cast<const __nv_bfloat16*>(p.q) + (ok ? (row_base + m0 + r) * kQK : 0);
#pragma unroll
    for (int c = sub; c < kChunks; c += 4) cp_async16(qs_u + wg_off(r, c), src + c * 8, ok);
    if (use_tma) {
      if (tid == 0) tma_first();
    } else {
      load_kv(tile_begin, 0);
    }
    cp_async_commit();
  }

  // Accumulator layout (both S and O): this thread holds rows lrow0 = 16 wr + g and lrow1 =
  // lrow0 + 8; element 4 i + e is column 8 i + 2 qd + (e & 1) of row (e < 2 ? lrow0 : lrow1).
  const int g = lane >> 2, qd = lane & 3;
  const int lrow0 = wr * 16 + g, lrow1 = lrow0 + 8;
  const int t_row0 = min(m0 + lrow0, rows_b - 1) / p.heads;
  const int t_row1 = min(m0 + lrow1, rows_b - 1) / p.heads;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = (tile - tile_begin) & 1;
    cp_async_wait_all();
    const uint32_t parity = ((tile - tile_begin) >> 1) & 1;  // of this stage's mbarrier
    fence_proxy_async();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
    __syncthreads();      // tile's KV (and Q) landed; everyone is done with the previous tile
    if (use_tma && tid == 0 && more(tile)) tma_advance(tile, stage);
    if (use_tma) mbar_wait(bar_u + 8 * stage, parity);
    const uint32_t kv_u = kvs_u + stage * kWgTile;
    const int kv0 = tile * kWgBN;

    // S[64, keys 32 wg..] = Q K^T over 36 k-steps of 16 dims.
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kQK / 16; ++kk) {
      const uint32_t koff = (kk >> 2) * 8192 + (kk & 3) * 32;
      wgmma_n32_kk(s, wg_desc(qs_u + koff, 16, 1024), wg_desc(kv_u + wg * 4096 + koff, 16, 1024),
                   1);
    }
    wg_commit();
    if (!use_tma && more(tile)) {  // stage ^ 1's readers finished last tile
      load_kv(tile + 1, stage ^ 1);
      cp_async_commit();
    }
    wg_wait0();

    // Scale, mask (only tiles that reach the tree or the end), row max.
    const bool need_mask = kv0 + kWgBN > prefix;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int e = i & 3, pos = kv0 + wg * 32 + (i >> 2) * 8 + 2 * qd + (e & 1);
      float x = s[i] * p.scale_log2;
      if (need_mask && !visible(p, b, e < 2 ? t_row0 : t_row1, prefix, kv_len, pos)) x = -INFINITY;
      s[i] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    if (qd == 0) {
      red_max[wg * kWgBM + lrow0] = mx[0];
      red_max[wg * kWgBM + lrow1] = mx[1];
    }
    __syncthreads();
    if (use_tma && kv_len - kv0 < kWgBN)  // both QKs are done with K
      wg_zero_dead_rows(gbase + (kv_u - base), kv_len - kv0, kWgThreads);
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new =
          fmaxf(fmaxf(m_run[h], mx[h]), red_max[(wg ^ 1) * kWgBM + (h ? lrow1 : lrow0)]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = exp2f(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
    // P = exp2(S - m) -> bf16, [64 rows][64 keys] swizzled (K-major A operand of PV).
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = exp2f(s[4 * j] - m_use[0]), p1 = exp2f(s[4 * j + 1] - m_use[0]);
      const float p2 = exp2f(s[4 * j + 2] - m_use[1]), p3 = exp2f(s[4 * j + 3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int c = wg * 4 + j;
      *reinterpret_cast<__nv_bfloat162*>(ps + lrow0 * 128 + ((c ^ (lrow0 & 7)) << 4) + qd * 4) =
          __floats2bfloat162_rn(p0, p1);
      *reinterpret_cast<__nv_bfloat162*>(ps + lrow1 * 128 + ((c ^ (lrow1 & 7)) << 4) + qd * 4) =
          __floats2bfloat162_rn(p2, p3);
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    }
    fence_proxy_async();  // P stores (generic proxy) -> wgmma reads
    __syncthreads();


    // O[64, dims 256 wg..] += P[64, 64] V[64 keys, 256 dims] (V MN-major: transposed B).
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kWgBN / 16; ++ks) {
      const uint64_t da = wg_desc(ps_u + ks * 32, 16, 1024);
      const uint32_t vb = kv_u + wg * 4 * 8192 + ks * 16 * 128;
      wgmma_n256_kt(o, da, wg_desc(vb, 8192, 1024), 1);
    }
    wg_commit();
    wg_wait0();
  }

  // Row sums: quad, then the other warpgroup (other key half).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  __syncthreads();
  if (qd == 0) {
    red_sum[wg * kWgBM + lrow0] = l_run[0];
    red_sum[wg * kWgBM + lrow1] = l_run[1];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int lrow = h ? lrow1 : lrow0;
    if (m0 + lrow >= rows_b) continue;
    const float l = red_sum[lrow] + red_sum[kWgBM + lrow];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t grow = row_base + m0 + lrow;
    const int dim = wg * 256 + 2 * qd;
    if (p.num_splits == 1) {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + grow * kV + dim;
#pragma unroll
      for (int i = 0; i < 32; ++i)
        *reinterpret_cast<__nv_bfloat162*>(out + i * 8) =
            __floats2bfloat162_rn(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
    } else {
      float* out = p.part_o + (static_cast<int64_t>(bz) * p.total_rows + grow) * kV + dim;
#pragma unroll
      for (int i = 0; i < 32; ++i)
        *reinterpret_cast<float2*>(out + i * 8) =
            make_float2(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
      if (wg == 0 && qd == 0)
        p.part_lse[static_cast<int64_t>(bz) * p.total_rows + grow] =
            l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
    }
  }
#endif  // TVA_WG_REAL
}
