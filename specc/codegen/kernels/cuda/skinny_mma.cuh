// Device helpers of the register-fed tensor-core kernels for 1 .. 32 rows (swap AB: the weights
// are the MMA's A operand, 16 weight rows per warp; x^T is B, one, two or four 8-row tiles).
//
// A lane (g = lane / 4, t = lane % 4) loads 16-byte vectors of weight rows g and g + 8 and of
// the same K positions of x rows g, g + 8, ... (one per x tile); an MMA sums over k, so the k order inside it is
// free as long as both operands use the same one, and the vectors become fragments without a
// shuffle or shared memory. Used by specc/codegen/kernels/cuda/linear_bf12_mma.cu and by
// examples/skinny_mma.py (its bf16 kernel).
#pragma once

typedef unsigned short bf16_t;
typedef unsigned int u32;
struct __align__(16) V4 { u32 w[4]; };  // 16 bytes: 8 bf16 or 16 bytes of a plane

// weights are read once: no L1 allocation. SKINNY_L2_PREFETCH (0, 128 or 256): ask L2 to fetch
// that many bytes around each miss from DRAM (the warps of a CTA read adjacent 64-byte pieces of
// a row at about the same time); the bf12 kernel builds with 256 (linear_bf12_mma.L2_PREFETCH_ENV)
#ifndef SKINNY_L2_PREFETCH
#define SKINNY_L2_PREFETCH 0
#endif
#if SKINNY_L2_PREFETCH == 256
#define SKINNY_WEIGHT_LOAD "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"
#elif SKINNY_L2_PREFETCH == 128
#define SKINNY_WEIGHT_LOAD "ld.global.nc.L1::no_allocate.L2::128B.v4.u32"
#else
#define SKINNY_WEIGHT_LOAD "ld.global.nc.L1::no_allocate.v4.u32"
#endif
__device__ __forceinline__ V4 load_weights(const void* p) {
  V4 v;
  asm volatile(SKINNY_WEIGHT_LOAD " {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
  return v;
}

// x is read by every CTA: keep it in L1 / L2
__device__ __forceinline__ V4 load_x(const bf16_t* p) {
  V4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
  return v;
}

__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ bf16_t to_bf16(float v) {
  bf16_t out;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(out) : "f"(v));
  return out;
}

__device__ __forceinline__ float from_bf16(bf16_t v) { return __int_as_float(((int)v) << 16); }

// programmatic dependent launch (sm_90+): wait for the previous kernel's writes, then let the
// next kernel start; a no-op when launched without the PDL attribute
__device__ __forceinline__ void pdl_wait_then_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The lane's 4 MT accumulators (MT 8-row x tiles): s[4 j .. 4 j + 3] x tile j; s[i] is weight
// row g (+ 8 when i % 4 >= 2) and x row 8 (i / 4) + 2t + (i % 2).
__device__ __forceinline__ int acc_row(int i, int t) { return 8 * (i >> 2) + 2 * t + (i & 1); }
__device__ __forceinline__ int acc_col(int i, int g) { return g + ((i & 2) ? 8 : 0); }

template <int NS>
__device__ __forceinline__ void store_lane(const float (&s)[NS], bf16_t* y, long stride_y, int M, int n0, int g,
                                           int t) {
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int m = acc_row(i, t);
    if (m < M) y[m * stride_y + n0 + acc_col(i, g)] = to_bf16(s[i]);
  }
}

// The CTA's sum into s (lanes of warp 0): its warps' accumulators (c[j]: x tile j) added in warp
// order in shared memory; with split-K (gridDim.y > 1) each CTA's sum goes to the fp32 workspace
// (4 MT floats per lane) and the last CTA of a row block (a ticket) adds them up in split order,
// deterministic whoever finishes last, and resets its ticket for the next launch (and graph
// replay). Returns whether this lane holds the row block's total.
template <int WARPS, int MT>
__device__ __forceinline__ bool reduce_cta(const float (&c)[MT][4], float (&s)[4 * MT],
                                           float* __restrict__ ws, unsigned* __restrict__ tickets) {
  constexpr int NS = 4 * MT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = blockIdx.y, splits = gridDim.y;
  __shared__ float red[WARPS][32][NS];
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][lane][4 * j + i] = c[j][i];
  __syncthreads();
  if (warp != 0) return false;
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    s[i] = red[0][lane][i];
#pragma unroll
    for (int v = 1; v < WARPS; ++v) s[i] += red[v][lane][i];
  }
  if (splits == 1) return true;
  float* mine = ws + (((long)split * gridDim.x + blockIdx.x) * 32 + lane) * NS;
#pragma unroll
  for (int i = 0; i < NS; ++i) mine[i] = s[i];
  __threadfence();
  __syncwarp();
  unsigned ticket = 0;
  if (lane == 0) ticket = atomicAdd(tickets + blockIdx.x, 1u);
  ticket = __shfl_sync(0xffffffffu, ticket, 0);
  if (ticket != (unsigned)(splits - 1)) return false;
  __threadfence();
#pragma unroll
  for (int i = 0; i < NS; ++i) s[i] = 0.f;
  for (int p = 0; p < splits; ++p) {
    const float* part = ws + (((long)p * gridDim.x + blockIdx.x) * 32 + lane) * NS;
#pragma unroll
    for (int i = 0; i < NS; ++i) s[i] += __ldcg(part + i);
  }
  __syncwarp();
  if (lane == 0) tickets[blockIdx.x] = 0u;
  return true;
}

#if !defined(__CUDACC_RTC__)  // host side (nvcc): NVRTC compile checks see the device code only
#include <cuda_runtime.h>

// launch kernel<<<grid, threads, smem, stream>>>(args...), with programmatic dependent launch when
// pdl (it may then start while the previous kernel on the stream finishes: see pdl_wait_then_release)
template <typename... Params, typename... Args>
cudaError_t launch_maybe_pdl(void (*kernel)(Params...), dim3 grid, int threads, size_t smem, cudaStream_t stream,
                             bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}
#endif
