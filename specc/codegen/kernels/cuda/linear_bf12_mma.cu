// y[M, N] = x[M, K] @ W^T (+ bias) for M = 1 .. 16 on bf12 layout-2 weights, decoded in registers
// straight into mma.sync fragments (specc/codegen/kernels/linear_bf12_mma.py says why and when).
//
// Per weight row: sm [Kp] sign|mantissa bytes in K order, ex [Kp / 2] codes (32-weight group G:
// byte i's low nibble is weight 32G + i, its high nibble weight 32G + 16 + i), base per row (or
// one per tensor: stride_base 0). Lane t of a 64-weight super-group S takes weights 64S + 16t ..
// + 15: 16 sm bytes (one 16-byte load) and the 16 code bytes of group 2S + t / 2 (lanes t and
// t ^ 1 load the same ones), nibble t % 2. MMA i of the super-group uses the lane's weights
// 4i .. 4i + 3 and x's same k. A weight decodes to ((sm & 0x80) << 8 | (0x70 + code) << 7 |
// (sm & 0x7F)) = W * 2**(112 - base); the row's power of two is multiplied back after the sum
// (exact). Escapes decode to the format's stand-in 2**(base - 127); after the sum the lane that
// stores an output adds x[m, col] * true - x[m, col] * stand-in for each escape of its rows (the
// CSR table of bf12_launch.escape_meta), then the bias, then rounds once to bf16.
//
// Fused RMSNorm prologue (norm_w given): every CTA first computes the fp32 inverse RMS of each
// x row (rsqrt(mean(x^2) + eps), over the whole row), then normalizes x as it loads it, rounding
// where specc.models.ops.rms_norm rounds: n = bf16(x * rstd), h = bf16(g * n). The escape fix-up
// reads the same normalized values. Fused residual (residual given): the rounded product plus r,
// rounded again: the two roundings of ``r + linear(x)`` as separate ops.
#include "skinny_mma.cuh"

__device__ __forceinline__ u32 prmt(u32 a, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(r) : "r"(a), "r"(sel));
  return r;
}

// two bf16 (bits) from sm bytes and code bytes at positions (p, p + 1) of the words (sel 0x4140 or 0x4342)
__device__ __forceinline__ u32 decode_pair(u32 smw, u32 codew, u32 sel, int high) {
  const u32 s = prmt(smw, sel);                       // [sm_p, 0, sm_p+1, 0]
  const u32 e = (prmt(codew, sel) >> (4 * high)) & 0x000F000Fu;
  return ((s & 0x00800080u) << 8) | (s & 0x007F007Fu) | ((e + 0x00700070u) << 7);
}

__device__ __forceinline__ float base_scale(unsigned char base) {  // 2**(base - 112)
  return __int_as_float(((int)base + 15) << 23);
}

// rms_norm's roundings on two bf16 of x (a word) with their norm weights g (a word)
__device__ __forceinline__ u32 norm_pair(u32 xw, u32 gw, float rstd) {
  const bf16_t n0 = to_bf16(__int_as_float(xw << 16) * rstd);
  const bf16_t n1 = to_bf16(__int_as_float(xw & 0xFFFF0000u) * rstd);
  const bf16_t h0 = to_bf16(__int_as_float(gw << 16) * from_bf16(n0));
  const bf16_t h1 = to_bf16(__int_as_float(gw & 0xFFFF0000u) * from_bf16(n1));
  return (u32)h0 | ((u32)h1 << 16);
}

__device__ __forceinline__ V4 norm_vec(V4 x, V4 g, float rstd) {
  V4 r;
#pragma unroll
  for (int i = 0; i < 4; ++i) r.w[i] = norm_pair(x.w[i], g.w[i], rstd);
  return r;
}

// the inverse RMS of x rows 0 .. M - 1 into rstd (shared; the host fuses the norm for few rows
// only: every CTA reads the rows whole). All threads share a row: thread i sums the squares of
// 8 consecutive k per 16-byte load, 4 loads in flight, then warps and the CTA add up.
template <int WARPS>
__device__ __forceinline__ void rows_rstd(const bf16_t* __restrict__ x, int M, int K, long stride_x, float eps,
                                          float* rstd) {
  constexpr int STRIDE = WARPS * 32 * 8;  // k covered by one load of every thread
  __shared__ float part[WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int m = 0; m < M; ++m) {
    const bf16_t* row = x + m * stride_x;
    float acc = 0.f;
    for (int k0 = 8 * threadIdx.x; k0 < K; k0 += 4 * STRIDE) {
      V4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (k0 + j * STRIDE < K) v[j] = load_x(row + k0 + j * STRIDE);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (k0 + j * STRIDE >= K) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float a = __int_as_float(v[j].w[i] << 16), b = __int_as_float(v[j].w[i] & 0xFFFF0000u);
          acc += a * a + b * b;
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) s += part[w];
      rstd[m] = rsqrtf(s / (float)K + eps);
    }
    __syncthreads();
  }
}

// grid (N / 16, splits), WARPS warps; the host checks N % 16 == 0, Kp % (64 * U * splits) == 0,
// 16-byte aligned rows; PREFETCH: double-buffer the weight registers across chunks
template <int MT, int U, int WARPS, bool PREFETCH>
__global__ void __launch_bounds__(WARPS * 32)
bf12_mma(const bf16_t* __restrict__ x, const unsigned char* __restrict__ sm, const unsigned char* __restrict__ ex,
         const unsigned char* __restrict__ base, int stride_base, const int* __restrict__ rowptr,
         const int* __restrict__ ecol, const float* __restrict__ etrue, const float* __restrict__ efake,
         const bf16_t* __restrict__ bias, const bf16_t* __restrict__ norm_w, float eps,
         const bf16_t* __restrict__ residual, long stride_r, bf16_t* __restrict__ y, float* __restrict__ ws,
         unsigned* __restrict__ tickets, int M, int Kp, int k_split, long stride_x, long stride_y) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, high = t & 1;
  const int n0 = blockIdx.x * 16, split = blockIdx.y;
  const int chunks = k_split / (64 * U);
  const long k_lo = (long)split * k_split;
  const unsigned char* sa = sm + (long)(n0 + g) * Kp + k_lo + 16 * t;
  const unsigned char* sb = sa + 8L * Kp;
  const unsigned char* ea = ex + (long)(n0 + g) * (Kp / 2) + k_lo / 2 + 16 * (t >> 1);
  const unsigned char* eb = ea + 8L * (Kp / 2);
  const int row_a = g < M ? g : 0, row_b = g + 8 < M ? g + 8 : 0;  // x rows past M: never stored
  const bf16_t* xa = x + (long)row_a * stride_x + k_lo + 16 * t;
  const bf16_t* xb = x + (long)row_b * stride_x + k_lo + 16 * t;
  const bf16_t* gk = norm_w + k_lo + 16 * t;  // the norm weights of the lane's k (norm_w given)
  __shared__ float rstd[16];
  float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
  V4 rsa[U], rsb[U], rea[U], reb[U];
  if (PREFETCH && warp < chunks) {  // the first chunk's weights (which no kernel writes) before the wait
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = warp * 64 * U + 64 * u;
      rsa[u] = load_weights(sa + k0);
      rsb[u] = load_weights(sb + k0);
      rea[u] = load_weights(ea + k0 / 2);
      reb[u] = load_weights(eb + k0 / 2);
    }
  }
  pdl_wait_then_release();
  if (norm_w != nullptr) rows_rstd<WARPS>(x, M, Kp, stride_x, eps, rstd);
  const float rstd_a = norm_w != nullptr ? rstd[row_a] : 1.f, rstd_b = norm_w != nullptr ? rstd[row_b] : 1.f;
  for (int c = warp; c < chunks; c += WARPS) {
    V4 nsa[U], nsb[U], nea[U], neb[U];
    const int kc = (PREFETCH ? (c + WARPS < chunks ? c + WARPS : c) : c) * 64 * U;  // the last reloads itself
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = kc + 64 * u;
      nsa[u] = load_weights(sa + k0);
      nsb[u] = load_weights(sb + k0);
      nea[u] = load_weights(ea + k0 / 2);
      neb[u] = load_weights(eb + k0 / 2);
    }
    if (!PREFETCH) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        rsa[u] = nsa[u]; rsb[u] = nsb[u]; rea[u] = nea[u]; reb[u] = neb[u];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = c * 64 * U + 64 * u;
      V4 x0a = load_x(xa + k0), x1a = load_x(xa + k0 + 8);
      V4 x0b, x1b;
      if (MT == 2) { x0b = load_x(xb + k0); x1b = load_x(xb + k0 + 8); }
      if (norm_w != nullptr) {
        const V4 g0 = load_x(gk + k0), g1 = load_x(gk + k0 + 8);
        x0a = norm_vec(x0a, g0, rstd_a);
        x1a = norm_vec(x1a, g1, rstd_a);
        if (MT == 2) {
          x0b = norm_vec(x0b, g0, rstd_b);
          x1b = norm_vec(x1b, g1, rstd_b);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const u32 a0 = decode_pair(rsa[u].w[i], rea[u].w[i], 0x4140u, high);
        const u32 a2 = decode_pair(rsa[u].w[i], rea[u].w[i], 0x4342u, high);
        const u32 a1 = decode_pair(rsb[u].w[i], reb[u].w[i], 0x4140u, high);
        const u32 a3 = decode_pair(rsb[u].w[i], reb[u].w[i], 0x4342u, high);
        const u32 b0 = (i < 2 ? x0a : x1a).w[(2 * i) & 3], b1 = (i < 2 ? x0a : x1a).w[(2 * i + 1) & 3];
        mma16816(c0, a0, a1, a2, a3, b0, b1);
        if (MT == 2) {
          const u32 d0 = (i < 2 ? x0b : x1b).w[(2 * i) & 3], d1 = (i < 2 ? x0b : x1b).w[(2 * i + 1) & 3];
          mma16816(c1, a0, a1, a2, a3, d0, d1);
        }
      }
    }
    if (PREFETCH) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        rsa[u] = nsa[u]; rsb[u] = nsb[u]; rea[u] = nea[u]; reb[u] = neb[u];
      }
    }
  }
  const float scale_a = base_scale(base[(n0 + g) * stride_base]);
  const float scale_b = base_scale(base[(n0 + g + 8) * stride_base]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float sc = (i & 2) ? scale_b : scale_a;
    c0[i] *= sc;
    c1[i] *= sc;
  }
  float s[8];
  if (!reduce_cta<WARPS>(c0, c1, s, ws, tickets)) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the escapes of the lane's two weight rows: exact products in fp32
    const int n = n0 + g + 8 * h;
    for (int e = rowptr[n]; e < rowptr[n + 1]; ++e) {
      const long col = ecol[e];
      const float w_true = etrue[e], w_fake = efake[e];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int m = acc_row(i, t);
        if (((i >> 1) & 1) == h && m < M) {
          float xv = from_bf16(x[m * stride_x + col]);
          if (norm_w != nullptr)  // the value the MMA saw: rms_norm's roundings
            xv = from_bf16(to_bf16(from_bf16(norm_w[col]) * from_bf16(to_bf16(xv * rstd[m]))));
          s[i] += xv * w_true - xv * w_fake;
        }
      }
    }
  }
  if (bias != nullptr) {
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] += from_bf16(bias[n0 + acc_col(i, g)]);
  }
  if (residual != nullptr) {  // the rounded product plus r (rounded again by the store)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int m = acc_row(i, t);
      if (m < M) s[i] = from_bf16(to_bf16(s[i])) + from_bf16(residual[m * stride_r + n0 + acc_col(i, g)]);
    }
  }
  store_lane(s, y, stride_y, M, n0, g, t);
}

#ifndef SPECC_NVRTC  // the host launch (nvcc); NVRTC compile checks instantiate the kernels themselves
#include <stdexcept>
#include <string>

template <int MT, int U, int WARPS, bool P>
static cudaError_t launch_one(bool pdl, dim3 grid, cudaStream_t stream, const void* x, const void* sm,
                              const void* ex, const void* base, int stride_base, const void* rowptr,
                              const void* ecol, const void* etrue, const void* efake, const void* bias,
                              const void* norm_w, float eps, const void* residual, long stride_r, void* y,
                              void* ws, void* tickets, int M, int Kp, int k_split, long stride_x, long stride_y) {
  return launch_maybe_pdl(bf12_mma<MT, U, WARPS, P>, grid, WARPS * 32, stream, pdl, (const bf16_t*)x, (const unsigned char*)sm,
                            (const unsigned char*)ex, (const unsigned char*)base, stride_base, (const int*)rowptr,
                            (const int*)ecol, (const float*)etrue, (const float*)efake, (const bf16_t*)bias,
                            (const bf16_t*)norm_w, eps, (const bf16_t*)residual, stride_r, (bf16_t*)y,
                            (float*)ws, (unsigned*)tickets, M, Kp, k_split, stride_x, stride_y);
}

void bf12_mma_launch(int mt, int unroll, int warps, bool prefetch, bool pdl, dim3 grid, cudaStream_t stream,
                     const void* x, const void* sm, const void* ex, const void* base, int stride_base,
                     const void* rowptr, const void* ecol, const void* etrue, const void* efake, const void* bias,
                     const void* norm_w, float eps, const void* residual, long stride_r, void* y, void* ws,
                     void* tickets, int M, int Kp, int k_split, long stride_x, long stride_y) {
#define SPECC_BF12_ARGS pdl, grid, stream, x, sm, ex, base, stride_base, rowptr, ecol, etrue, efake, bias, norm_w, \
                        eps, residual, stride_r, y, ws, tickets, M, Kp, k_split, stride_x, stride_y
#define SPECC_BF12_CASE(MT, U, W)                                                                        \
  case MT * 100 + U * 10 + W / 4:                                                                        \
    err = prefetch ? launch_one<MT, U, W, true>(SPECC_BF12_ARGS) : launch_one<MT, U, W, false>(SPECC_BF12_ARGS); \
    break;
  cudaError_t err = cudaErrorInvalidValue;
  switch (mt * 100 + unroll * 10 + warps / 4) {
    SPECC_BF12_CASE(1, 1, 4) SPECC_BF12_CASE(1, 1, 8) SPECC_BF12_CASE(1, 2, 4) SPECC_BF12_CASE(1, 2, 8)
    SPECC_BF12_CASE(2, 1, 4) SPECC_BF12_CASE(2, 1, 8) SPECC_BF12_CASE(2, 2, 4) SPECC_BF12_CASE(2, 2, 8)
    default:
      throw std::invalid_argument("bf12_mma: unroll in {1, 2}, warps in {4, 8}");
  }
#undef SPECC_BF12_CASE
#undef SPECC_BF12_ARGS
  if (err != cudaSuccess) throw std::runtime_error(std::string("bf12_mma launch: ") + cudaGetErrorString(err));
}
#endif
