// tree_verify_attention_mma.cuh: the portable tensor-core path of the tree-verify attention
// (mma.sync m16n8k16 bf16 with ldmatrix and cp.async; sm_80 and newer, sm_120 included) and
// the helpers the wgmma path reuses. Included by
// tree_verify_attention.cu inside its anonymous namespace, after Params and the SIMT kernel.
#pragma once

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk c of row r in a [rows][72 chunks] swizzled bf16 tile.
__device__ __forceinline__ uint32_t qk_off(int r, int c) {
  return static_cast<uint32_t>((r * kChunks + (c ^ (r & 7))) * 16);
}
// Same for the [BM][BN] bf16 P tile (CPR = BN / 8 chunks a row, a power of two <= 8).
template <int CPR>
__device__ __forceinline__ uint32_t p_off(int r, int c) {
  return static_cast<uint32_t>((r * CPR + (c ^ ((r / (8 / CPR)) & (CPR - 1)))) * 16);
}

// BM query rows x BN keys a tile, STAGES KV buffers, NC column groups (warp (r, c) computes
// keys [c BN/NC, +BN/NC) of S for rows [16 r, +16)), MINB CTAs per SM. PV: warp w accumulates
// O for all BM rows and value dims [w 512/warps, +512/warps), so each V element is read from
// shared memory once per CTA (row rescale factors and sums go through shared memory).
template <int BM, int BN, int STAGES, int NC, int MINB>
struct MmaCfg {
  static constexpr int kWarps = BM / 16 * NC, kThreads = kWarps * 32;
  static constexpr int kTileBytes = BN * kQK * 2, kQBytes = BM * kQK * 2;
  static constexpr int kPBytes = BM * BN * 2, kRedBytes = (2 * NC + 1) * BM * 4;
  static constexpr int kSmem = kQBytes + STAGES * kTileBytes + kPBytes + kRedBytes;
  static constexpr int kTpr = kThreads / BN;  // loader threads per KV row
  static_assert(kThreads % BN == 0 && kChunks % kTpr == 0, "KV loader mapping");
  static_assert(kThreads % BM == 0 && kChunks % (kThreads / BM) == 0, "Q loader mapping");
  static_assert(BN % (16 * NC) == 0 && BN <= 64, "key groups of whole 16-key steps");
};

template <int BM, int BN, int STAGES, int NC, int MINB>
__global__ void __launch_bounds__(MmaCfg<BM, BN, STAGES, NC, MINB>::kThreads, MINB)
    tva_mma_kernel(Params p) {
  using Cfg = MmaCfg<BM, BN, STAGES, NC, MINB>;
  constexpr int kKw = BN / NC, kNtS = kKw / 8;  // keys and S n-tiles of a warp
  constexpr int kMt = BM / 16, kDw1 = kV / Cfg::kWarps, kNt1 = kDw1 / 8;  // PV: dims a warp
  constexpr int kAcc = kMt * kNt1;  // O n-tiles (x4 floats) a thread holds
  static_assert(kNt1 % 2 == 0 && kAcc == kV / NC / 8, "PV layout");
  constexpr int kCpr = BN / 8;
  unsigned char* qs = dyn_smem;
  unsigned char* kvs = qs + Cfg::kQBytes;
  unsigned char* ps = kvs + STAGES * Cfg::kTileBytes;
  float* red_max = reinterpret_cast<float*>(ps + Cfg::kPBytes);  // [NC][BM]
  float* red_sum = red_max + NC * BM;                            // [NC][BM]
  float* row_alpha = red_sum + NC * BM;                          // [BM]

  const int b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp / NC, wc = warp % NC;
  const int q0 = p.qo_offsets[b], t_b = p.qo_offsets[b + 1] - q0;
  const int rows_b = t_b * p.heads, m0 = blockIdx.x * BM;
  if (m0 >= rows_b) return;
  const int prefix = p.prefix_lens[b], kv_len = prefix + t_b;
  int tile_begin, tile_end;
  split_range(p, (kv_len + BN - 1) / BN, &tile_begin, &tile_end);
  const int64_t row_base = static_cast<int64_t>(q0) * p.heads;
  const __nv_bfloat16* kvg = static_cast<const __nv_bfloat16*>(p.kv);

  auto load_kv = [&](int tile, int stage) {
    const int r = tid / Cfg::kTpr, sub = tid % Cfg::kTpr, pos = tile * BN + r;
    const bool ok = pos < kv_len;
    const __nv_bfloat16* src = ok ? kvg + kv_slot(p, b, pos) * kQK : kvg;
    const uint32_t dst = smem_u32(kvs + stage * Cfg::kTileBytes);
#pragma unroll
    for (int c = sub; c < kChunks; c += Cfg::kTpr)
      cp_async16(dst + qk_off(r, c), src + (ok ? c * 8 : 0), ok);
  };

  if (tile_begin < tile_end) {
    {  // Q tile (rows past the request's end are zero-filled)
      constexpr int kTprQ = Cfg::kThreads / BM;
      const int r = tid / kTprQ, sub = tid % kTprQ;
      const bool ok = m0 + r < rows_b;
      const __nv_bfloat16* src =
          static_cast<const __nv_bfloat16*>(p.q) + (ok ? (row_base + m0 + r) * kQK : 0);
      const uint32_t dst = smem_u32(qs);
#pragma unroll
      for (int c = sub; c < kChunks; c += kTprQ) cp_async16(dst + qk_off(r, c), src + c * 8, ok);
    }
    load_kv(tile_begin, 0);
    cp_async_commit();
  }

  // Fixed rows of this thread in the accumulator layout: g and g + 8 of the warp's 16.
  const int g = lane >> 2, qd = lane & 3;
  const int lrow0 = wr * 16 + g, lrow1 = lrow0 + 8;
  const int t_row0 = min(m0 + lrow0, rows_b - 1) / p.heads;
  const int t_row1 = min(m0 + lrow1, rows_b - 1) / p.heads;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[kAcc][4];
#pragma unroll
  for (int j = 0; j < kAcc; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  const bool rows_live = m0 + wr * 16 < rows_b;  // this warp's S rows hold any real row

  const uint32_t qs_u = smem_u32(qs), ps_u = smem_u32(ps);
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int stage = STAGES == 1 ? 0 : (tile - tile_begin) % STAGES;
    if (STAGES == 1 && tile != tile_begin) {  // single buffer: reload once everyone is done
      __syncthreads();
      load_kv(tile, 0);
      cp_async_commit();
    }
    cp_async_wait_all();
    __syncthreads();  // tile's KV (and Q) landed; everyone is done with the previous tile
    if (STAGES > 1 && tile + 1 < tile_end) {
      load_kv(tile + 1, (tile + 1 - tile_begin) % STAGES);
      cp_async_commit();
    }
    const uint32_t kv_u = smem_u32(kvs + stage * Cfg::kTileBytes);
    const int kv0 = tile * BN;

    // S = Q K^T for rows [16 wr, +16) x keys [kKw wc, +kKw).
    float s[kNtS][4];
#pragma unroll
    for (int j = 0; j < kNtS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < (rows_live ? kQK / 16 : 0); ++kk) {
      uint32_t a[4];
      ldsm_x4(qs_u + qk_off(wr * 16 + (lane & 15), 2 * kk + (lane >> 4)), a);
#pragma unroll
      for (int j = 0; j < kNtS; j += 2) {
        uint32_t bb[4];
        const int key = wc * kKw + j * 8 + (lane & 7) + ((lane >> 4) << 3);
        ldsm_x4(kv_u + qk_off(key, 2 * kk + ((lane >> 3) & 1)), bb);
        mma_bf16(s[j], a, bb[0], bb[1]);
        mma_bf16(s[j + 1], a, bb[2], bb[3]);
      }
    }
    // Scale, mask (only tiles that reach the tree or the end), row max.
    const bool need_mask = kv0 + BN > prefix;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kNtS; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pos = kv0 + wc * kKw + j * 8 + 2 * qd + (e & 1);
        float x = s[j][e] * p.scale_log2;
        if (need_mask && !visible(p, b, e < 2 ? t_row0 : t_row1, prefix, kv_len, pos))
          x = -INFINITY;
        s[j][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    if (qd == 0) {
      red_max[wc * BM + lrow0] = mx[0];
      red_max[wc * BM + lrow1] = mx[1];
    }
    __syncthreads();
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_new = fmaxf(m_run[h], mx[h]);
#pragma unroll
      for (int c = 1; c < NC; ++c)
        m_new = fmaxf(m_new, red_max[((wc + c) % NC) * BM + (h ? lrow1 : lrow0)]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = exp2f(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
    // P = exp2(S - m) -> bf16 in shared memory; partial row sums stay per thread.
#pragma unroll
    for (int j = 0; j < kNtS; ++j) {
      const float p0 = exp2f(s[j][0] - m_use[0]), p1 = exp2f(s[j][1] - m_use[0]);
      const float p2 = exp2f(s[j][2] - m_use[1]), p3 = exp2f(s[j][3] - m_use[1]);
      l_run[0] += p0 + p1;
      l_run[1] += p2 + p3;
      const int c = (wc * kKw + j * 8) / 8;
      *reinterpret_cast<__nv_bfloat162*>(ps + p_off<kCpr>(lrow0, c) + qd * 4) =
          __floats2bfloat162_rn(p0, p1);
      *reinterpret_cast<__nv_bfloat162*>(ps + p_off<kCpr>(lrow1, c) + qd * 4) =
          __floats2bfloat162_rn(p2, p3);
    }
    if (wc == 0 && qd == 0) {
      row_alpha[lrow0] = alpha[0];
      row_alpha[lrow1] = alpha[1];
    }
    __syncthreads();  // P (and the rescale factors) complete
    // O[all BM rows, dims kDw1 warp..] += P[BM, BN] V[BN, kDw1]; dead m16 tiles skipped.
#pragma unroll
    for (int i = 0; i < kMt; ++i) {
      const float a0 = row_alpha[16 * i + g], a1 = row_alpha[16 * i + g + 8];
#pragma unroll
      for (int j = 0; j < kNt1; ++j) {
        o[i * kNt1 + j][0] *= a0;
        o[i * kNt1 + j][1] *= a0;
        o[i * kNt1 + j][2] *= a1;
        o[i * kNt1 + j][3] *= a1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
      uint32_t a[kMt][4];
#pragma unroll
      for (int i = 0; i < kMt; ++i)
        if (m0 + 16 * i < rows_b)
          ldsm_x4(ps_u + p_off<kCpr>(16 * i + (lane & 15), 2 * ks + (lane >> 4)), a[i]);
      const int key = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int j = 0; j < kNt1; j += 2) {
        uint32_t bb[4];
        ldsm_x4_t(kv_u + qk_off(key, (warp * kDw1 + j * 8) / 8 + (lane >> 4)), bb);
#pragma unroll
        for (int i = 0; i < kMt; ++i) {
          if (m0 + 16 * i >= rows_b) continue;
          mma_bf16(o[i * kNt1 + j], a[i], bb[0], bb[1]);
          mma_bf16(o[i * kNt1 + j + 1], a[i], bb[2], bb[3]);
        }
      }
    }
  }

  // Row sums: quad, then the partner warp (other key half).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  __syncthreads();
  if (qd == 0) {
    red_sum[wc * BM + lrow0] = l_run[0];
    red_sum[wc * BM + lrow1] = l_run[1];
  }
  __syncthreads();
  auto row_sum = [&](int lrow) {
    float l = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) l += red_sum[c * BM + lrow];
    return l;
  };
  if (p.num_splits > 1 && wc == 0 && qd == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lrow = h ? lrow1 : lrow0;
      const float l = row_sum(lrow);
      if (m0 + lrow < rows_b)
        p.part_lse[static_cast<int64_t>(blockIdx.z) * p.total_rows + row_base + m0 + lrow] =
            l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
    }
  }
#pragma unroll
  for (int i = 0; i < kMt; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lrow = 16 * i + g + 8 * h;
      if (m0 + lrow >= rows_b) continue;
      const float l = row_sum(lrow);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t grow = row_base + m0 + lrow;
      const int dim = warp * kDw1 + 2 * qd;
      if (p.num_splits == 1) {
        __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out) + grow * kV + dim;
#pragma unroll
        for (int j = 0; j < kNt1; ++j)
          *reinterpret_cast<__nv_bfloat162*>(out + j * 8) = __floats2bfloat162_rn(
              o[i * kNt1 + j][2 * h] * inv, o[i * kNt1 + j][2 * h + 1] * inv);
      } else {
        float* out =
            p.part_o + (static_cast<int64_t>(blockIdx.z) * p.total_rows + grow) * kV + dim;
#pragma unroll
        for (int j = 0; j < kNt1; ++j)
          *reinterpret_cast<float2*>(out + j * 8) =
              make_float2(o[i * kNt1 + j][2 * h] * inv, o[i * kNt1 + j][2 * h + 1] * inv);
      }
    }
  }
}
