// ddtree_common.cuh: device helpers shared by the DDTree kernels (ordered keys, loads,
// block reductions) and the host-side error convention. Internal: not part of the C ABI.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ddtree_kernels.h"

namespace ddtree {

// float -> uint32 whose unsigned order is the float order (-0.0 folded onto +0.0).
__device__ __forceinline__ uint32_t float_key(float x) {
  uint32_t u = __float_as_uint(x + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_float(uint32_t k) {
  uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  return __uint_as_float(u);
}

// double -> uint64 with the same order (-0.0 folded onto +0.0); 0 is below every real value.
__device__ __forceinline__ uint64_t double_key(double x) {
  uint64_t u = static_cast<uint64_t>(__double_as_longlong(x + 0.0));
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

__device__ __forceinline__ double key_double(uint64_t k) {
  uint64_t u = (k >> 63) ? (k & 0x7fffffffffffffffull) : ~k;
  return __longlong_as_double(static_cast<long long>(u));
}

// One element of a logits row, upcast to float.
template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Sixteen bytes of a row as floats: 8 bf16 or 4 fp32 values.
template <typename T>
struct Vec16 {
  static constexpr int N = 16 / sizeof(T);
};

__device__ __forceinline__ void unpack16(const uint4& v, float (&f)[4]) {
  f[0] = __uint_as_float(v.x);
  f[1] = __uint_as_float(v.y);
  f[2] = __uint_as_float(v.z);
  f[3] = __uint_as_float(v.w);
}

__device__ __forceinline__ void unpack16(const uint4& v, float (&f)[8]) {
  f[0] = __uint_as_float(v.x << 16);
  f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16);
  f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16);
  f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16);
  f[7] = __uint_as_float(v.w & 0xffff0000u);
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Calls f(index, value) for every element of a row, as this thread's share of a block of
// THREADS threads; 16-byte streaming loads, UNROLL in flight, when VEC.
template <typename T, bool VEC, int THREADS, int UNROLL, typename F>
__device__ __forceinline__ void for_row(const T* row, int64_t V, F&& f) {
  if constexpr (VEC) {
    constexpr int N = 16 / sizeof(T);
    const uint4* row4 = reinterpret_cast<const uint4*>(row);
    const int64_t nvec = V / N;
    int64_t v = threadIdx.x;
    for (; v + (UNROLL - 1) * THREADS < nvec; v += UNROLL * THREADS) {
      uint4 q[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) q[u] = load_stream(row4 + v + u * THREADS);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        float x[N];
        unpack16(q[u], x);
#pragma unroll
        for (int e = 0; e < N; ++e) f((v + u * THREADS) * N + e, x[e]);
      }
    }
    for (; v < nvec; v += THREADS) {
      float x[N];
      unpack16(load_stream(row4 + v), x);
#pragma unroll
      for (int e = 0; e < N; ++e) f(v * N + e, x[e]);
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += THREADS) f(i, to_float(row[i]));
  }
}

// Like for_row, but f(first_index, x, n) gets whole 16-byte chunks (n = 16 / sizeof(T)) when
// VEC, single elements (n = 1) otherwise.
template <typename T, bool VEC, int THREADS, int UNROLL, typename F>
__device__ __forceinline__ void for_row_chunks(const T* row, int64_t V, F&& f) {
  if constexpr (VEC) {
    constexpr int N = 16 / sizeof(T);
    const uint4* row4 = reinterpret_cast<const uint4*>(row);
    const int64_t nvec = V / N;
    int64_t v = threadIdx.x;
    for (; v + (UNROLL - 1) * THREADS < nvec; v += UNROLL * THREADS) {
      uint4 q[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) q[u] = load_stream(row4 + v + u * THREADS);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        float x[N];
        unpack16(q[u], x);
        f((v + u * THREADS) * N, x);
      }
    }
    for (; v < nvec; v += THREADS) {
      float x[N];
      unpack16(load_stream(row4 + v), x);
      f(v * N, x);
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += THREADS) {
      float x[1] = {to_float(row[i])};
      f(i, x);
    }
  }
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Whether rows of V elements of T starting at base can be read with 16-byte loads.
template <typename T>
inline bool rows_vectorizable(const void* base, int64_t V) {
  return (V * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(base) % 16 == 0;
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Block-wide max of a uint64 (all threads get it). scratch: >= 32 entries.
__device__ __forceinline__ uint64_t block_max_u64(uint64_t v, uint64_t* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max_u64(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0ull;
  return warp_max_u64(v);
}

// Block-wide sum of a uint32 (all threads get it). scratch: >= 32 entries.
__device__ __forceinline__ uint32_t block_sum_u32(uint32_t v, uint32_t* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = __reduce_add_sync(0xffffffffu, v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0u;
  return __reduce_add_sync(0xffffffffu, v);
}

}  // namespace ddtree

// Return the launch's error (if any) as the op's result code.
#define DDTREE_RETURN_LAST_ERROR() return static_cast<int>(cudaGetLastError())
