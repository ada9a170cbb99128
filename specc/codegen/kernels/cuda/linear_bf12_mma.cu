// y[M, N] = x[M, K] @ W^T (+ bias) for M = 1 .. 32 on bf12 layout-2 or -3 weights, decoded in registers
// straight into mma.sync fragments (specc/codegen/kernels/linear_bf12_mma.py says why and when).
//
// Per weight row: sm [Kp] sign|mantissa bytes in K order, ex [Kp / 2] codes (32-weight group G:
// byte i's low nibble is weight 32G + i, its high nibble weight 32G + 16 + i), base per row (or one
// per tensor: stride_base 0). Where a row's bytes sit is the layout's (bf12.plane_strides): byte j
// of super-group S of row 16 B + r is at sm + 16 B Kp + r * sm_row + S * sm_group + j (layout 2:
// sm_row = Kp, sm_group = 64; layout 3, 16 x 64 tiles: 64 and 1024, so a warp's two loads are one
// contiguous KB), ex likewise with ex_row, ex_group and 8 B Kp. Lane t of a 64-weight super-group S
// takes weights 64S + 16t .. + 15: 16 sm bytes (one 16-byte load) and the 16 code bytes of group 2S
// + t / 2 (lanes t and t ^ 1 load the same ones), nibble t % 2. MMA i of the super-group uses the
// lane's weights 4i .. 4i + 3 and x's same k. A weight decodes to ((sm & 0x80) << 8 | (0x70 + code)
// << 7 | (sm & 0x7F)) = W * 2**(112 - base); the row's power of two is multiplied back after the
// sum (exact). Escapes decode to the format's stand-in 2**(base - 127); after the sum the lane that
// stores an output adds x[m, col] * true - x[m, col] * stand-in for each escape of its rows (the
// CSR table of bf12_launch.escape_meta), then the bias, then rounds once to bf16.
//
// Epilogue inputs staged off the critical path: the rows' bases, escape ranges and the CTA's
// first ESC_CAP escapes (column, true and stand-in values), the bias and norm weights at them
// are constants, loaded before the PDL wait; x at the escapes' columns and the residual tile by
// cp.async after it, completed by the time the warps' sums meet. Read after the main loop they
// were a chain of ~5 dependent global round trips, which every CTA of a single-wave launch (the
// 8B model's o, down and qkv at one row) paid in full.
//
// Fused RMSNorm prologue (norm_w given): every CTA first computes the fp32 inverse RMS of each
// x row (rsqrt(mean(x^2) + eps), over the whole row), then stages its K range of the normalized
// rows in shared memory once, rounding where specc.models.ops.rms_norm rounds: n = bf16(x *
// rstd), h = bf16(g * n); the main loop reads x from there (normalizing as it loaded made every
// lane of a k position repeat the same work, 8 times per CTA). The escape fix-up applies the
// same roundings to x at the escape's column. Fused residual (residual given): the rounded
// product plus r, rounded again: the two roundings of ``r + linear(x)`` as separate ops.
#include "skinny_mma.cuh"

__device__ __forceinline__ u32 prmt(u32 a, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(r) : "r"(a), "r"(sel));
  return r;
}

// the lane's nibble of each code byte plus the exponent offset 0x70, per byte (no carries: code
// <= 15): once per code word, shared by its four weight pairs
__device__ __forceinline__ u32 biased_codes(u32 codew, int high) {
  return ((codew >> (4 * high)) & 0x0F0F0F0Fu) + 0x70707070u;
}

// two bf16 (bits) from sm bytes and biased codes at positions (p, p + 1) of the words: pair 0
// (p = 0) or 1 (p = 2). PRMT's sign-replicate mode puts each sm byte's sign in the byte above it,
// so one mask keeps sign (bit 15) and mantissa (bits 0-6), and the code lands at bits 7-14.
template <int PAIR>
__device__ __forceinline__ u32 decode_pair(u32 smw, u32 bcodes) {
  const u32 s = prmt(smw, PAIR ? 0xB3A2u : 0x9180u);     // [sm_p, sign(sm_p), sm_p+1, sign(sm_p+1)]
  const u32 e = prmt(bcodes, PAIR ? 0x4342u : 0x4140u);  // [0x70 + c_p, 0, 0x70 + c_p+1, 0]
  return (s & 0x807F807Fu) | (e << 7);
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

// 4-byte asynchronous copy global -> shared (sm_80+), completed by cp_async_wait_all: staging
// that needs no register while the main loop runs
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// the bf16 at element index i of 4-byte words (w: the word holding elements i & ~1, i | 1)
__device__ __forceinline__ float half_of(u32 w, int i) { return __int_as_float((i & 1) ? (w & 0xFFFF0000u) : (w << 16)); }

constexpr int ESC_CAP = 64;  // escapes per CTA staged in shared memory; any beyond are read in the epilogue

// What the epilogue reads besides the sums, staged in shared memory while the main loop streams
// (otherwise a chain of dependent global round trips after it: base, row pointers, escape,
// x at its column, residual, ~1 us each on a single-wave launch). Escapes are the CTA's first
// ESC_CAP in CSR order; the 4-byte words hold the bf16 element and its neighbour.
template <int MT>
struct EpilogueStage {
  int rp[17];                  // the 16 weight rows' escape ranges, relative to the CTA's first escape
  int col[ESC_CAP];
  float wt[ESC_CAP], wf[ESC_CAP];
  u32 g[ESC_CAP];              // norm_w at the escape's column (fused norm)
  u32 x[8 * MT][ESC_CAP];      // x row m at the escape's column
  u32 bias[8];                 // bias[n0 .. n0 + 15]
  u32 res[8 * MT][8];          // residual[m, n0 .. n0 + 15]
};

// the normalized x rows (rms_norm's roundings) of the CTA's K range into shared memory, once
template <int WARPS>
__device__ __forceinline__ void stage_normalized(const bf16_t* __restrict__ x, const bf16_t* __restrict__ norm_w,
                                                 int M, long k_lo, int k_split, long stride_x, const float* rstd,
                                                 bf16_t* xs) {
  for (int m = 0; m < M; ++m)
    for (int k = 8 * threadIdx.x; k < k_split; k += WARPS * 32 * 8)
      *reinterpret_cast<V4*>(xs + (long)m * k_split + k) =
          norm_vec(load_x(x + m * stride_x + k_lo + k), load_x(norm_w + k_lo + k), rstd[m]);
  __syncthreads();
}

// grid (N / 16, splits), WARPS warps, MT 8-row x tiles (M <= 8 MT: x rows 8 j + g of tile j),
// dynamic shared memory M * k_split bf16 with a fused norm;
// the host checks N % 16 == 0, Kp % (64 * U * splits) == 0, 16-byte aligned rows (x, norm_w),
// 4-byte aligned bias and residual rows; PREFETCH: double-buffer the weight registers across
// chunks and load the first chunk before the PDL wait
template <int MT, int U, int WARPS, bool PREFETCH>
__global__ void __launch_bounds__(WARPS * 32)
bf12_mma(const bf16_t* __restrict__ x, const unsigned char* __restrict__ sm, const unsigned char* __restrict__ ex,
         const unsigned char* __restrict__ base, int stride_base, const int* __restrict__ rowptr,
         const int* __restrict__ ecol, const float* __restrict__ etrue, const float* __restrict__ efake,
         const bf16_t* __restrict__ bias, const bf16_t* __restrict__ norm_w, float eps,
         const bf16_t* __restrict__ residual, long stride_r, bf16_t* __restrict__ y, float* __restrict__ ws,
         unsigned* __restrict__ tickets, int M, int Kp, int k_split, long stride_x, long stride_y,
         int sm_row, int sm_group, int ex_row, int ex_group) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3, high = t & 1;
  const int n0 = blockIdx.x * 16, split = blockIdx.y;
  const int chunks = k_split / (64 * U);
  const long k_lo = (long)split * k_split;
  const long sg_lo = k_lo / 64;  // the split's first super-group
  const unsigned char* sa = sm + (long)n0 * Kp + (long)g * sm_row + sg_lo * sm_group + 16 * t;
  const unsigned char* sb = sa + 8L * sm_row;
  const unsigned char* ea = ex + (long)n0 * (Kp / 2) + (long)g * ex_row + sg_lo * ex_group + 16 * (t >> 1);
  const unsigned char* eb = ea + 8L * ex_row;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  bf16_t* xs = reinterpret_cast<bf16_t*>(dyn_smem);  // [M][k_split] normalized x (norm_w given)
  const bf16_t* xr[MT];   // the lane's x row of each tile, from k_lo + 16 t
  const bf16_t* xsr[MT];  // the same rows staged normalized (fused norm)
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    const int row = 8 * j + g < M ? 8 * j + g : 0;  // x rows past M: never stored
    xr[j] = x + (long)row * stride_x + k_lo + 16 * t;
    xsr[j] = xs + row * k_split + 16 * t;
  }
  __shared__ float rstd[8 * MT];
  __shared__ __align__(16) EpilogueStage<MT> st;
  float acc[MT][4] = {};  // acc[j]: x tile j
  V4 rsa[U], rsb[U], rea[U], reb[U];
  if (PREFETCH && warp < chunks) {  // the first chunk's weights (which no kernel writes) before the wait
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k0 = warp * 64 * U + 64 * u;
      rsa[u] = load_weights(sa + (long)(k0 >> 6) * sm_group);
      rsb[u] = load_weights(sb + (long)(k0 >> 6) * sm_group);
      rea[u] = load_weights(ea + (long)(k0 >> 6) * ex_group);
      reb[u] = load_weights(eb + (long)(k0 >> 6) * ex_group);
    }
  }
  // constants (no kernel writes them) before the PDL wait: the rows' bases, escape table, bias
  const unsigned char base_a = base[(n0 + g) * stride_base], base_b = base[(n0 + g + 8) * stride_base];
  int e0 = 0, esc_col = 0;
  bool has_esc = false;
  if (tid < ESC_CAP) {
    e0 = rowptr[n0];
    if (tid <= 16) st.rp[tid] = rowptr[n0 + tid] - e0;
    has_esc = e0 + tid < rowptr[n0 + 16];
    if (has_esc) {
      esc_col = ecol[e0 + tid];
      st.col[tid] = esc_col;
      cp_async4(&st.wt[tid], etrue + e0 + tid);
      cp_async4(&st.wf[tid], efake + e0 + tid);
      if (norm_w != nullptr) cp_async4(&st.g[tid], norm_w + (esc_col & ~1));
    }
  }
  if (bias != nullptr && tid < 8) cp_async4(&st.bias[tid], bias + n0 + 2 * tid);
  pdl_wait_then_release();
  // what earlier kernels write: x at the escapes' columns, the residual tile
  if (has_esc)
    for (int m = 0; m < M; ++m) cp_async4(&st.x[m][tid], x + m * stride_x + (esc_col & ~1));
  if (residual != nullptr)
    for (int q = tid; q < 8 * M; q += WARPS * 32) cp_async4(&st.res[q >> 3][q & 7], residual + (q >> 3) * stride_r + n0 + 2 * (q & 7));
  if (norm_w != nullptr) {
    rows_rstd<WARPS>(x, M, Kp, stride_x, eps, rstd);
    stage_normalized<WARPS>(x, norm_w, M, k_lo, k_split, stride_x, rstd, xs);
  }
  for (int c = warp; c < chunks; c += WARPS) {
    V4 nsa[U], nsb[U], nea[U], neb[U];
    if (!PREFETCH || c + WARPS < chunks) {  // prefetching: the next chunk's weights, if any
      const int kc = (PREFETCH ? c + WARPS : c) * 64 * U;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k0 = kc + 64 * u;
        nsa[u] = load_weights(sa + (long)(k0 >> 6) * sm_group);
        nsb[u] = load_weights(sb + (long)(k0 >> 6) * sm_group);
        nea[u] = load_weights(ea + (long)(k0 >> 6) * ex_group);
        neb[u] = load_weights(eb + (long)(k0 >> 6) * ex_group);
      }
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
      V4 x0[MT], x1[MT];  // the lane's 16 k of each tile's x row
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        if (norm_w != nullptr) {  // staged once per CTA, already normalized
          x0[j] = *reinterpret_cast<const V4*>(xsr[j] + k0);
          x1[j] = *reinterpret_cast<const V4*>(xsr[j] + k0 + 8);
        } else {
          x0[j] = load_x(xr[j] + k0);
          x1[j] = load_x(xr[j] + k0 + 8);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const u32 ca = biased_codes(rea[u].w[i], high), cb = biased_codes(reb[u].w[i], high);
        const u32 a0 = decode_pair<0>(rsa[u].w[i], ca);
        const u32 a2 = decode_pair<1>(rsa[u].w[i], ca);
        const u32 a1 = decode_pair<0>(rsb[u].w[i], cb);
        const u32 a3 = decode_pair<1>(rsb[u].w[i], cb);
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          const V4& xv = i < 2 ? x0[j] : x1[j];
          mma16816(acc[j], a0, a1, a2, a3, xv.w[(2 * i) & 3], xv.w[(2 * i + 1) & 3]);
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
  const float scale_a = base_scale(base_a), scale_b = base_scale(base_b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float sc = (i & 2) ? scale_b : scale_a;
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[j][i] *= sc;
  }
  cp_async_wait_all();  // the staged epilogue inputs (reduce_cta's barrier makes them visible)
  float s[4 * MT];
  if (!reduce_cta<WARPS, MT>(acc, s, ws, tickets)) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the escapes of the lane's two weight rows: exact products in fp32
    for (int e = st.rp[g + 8 * h]; e < st.rp[g + 8 * h + 1]; ++e) {
      const bool staged = e < ESC_CAP;
      const int col = staged ? st.col[e] : ecol[e0 + e];
      const float w_true = staged ? st.wt[e] : etrue[e0 + e], w_fake = staged ? st.wf[e] : efake[e0 + e];
#pragma unroll
      for (int i = 0; i < 4 * MT; ++i) {
        const int m = acc_row(i, t);
        if (((i >> 1) & 1) == h && m < M) {
          float xv = staged ? half_of(st.x[m][e], col) : from_bf16(x[m * stride_x + col]);
          if (norm_w != nullptr) {  // the value the MMA saw: rms_norm's roundings
            const float gv = staged ? half_of(st.g[e], col) : from_bf16(norm_w[col]);
            xv = from_bf16(to_bf16(gv * from_bf16(to_bf16(xv * rstd[m]))));
          }
          s[i] += xv * w_true - xv * w_fake;
        }
      }
    }
  }
  if (bias != nullptr) {
#pragma unroll
    for (int i = 0; i < 4 * MT; ++i) s[i] += half_of(st.bias[acc_col(i, g) >> 1], acc_col(i, g));
  }
  if (residual != nullptr) {  // the rounded product plus r (rounded again by the store)
#pragma unroll
    for (int i = 0; i < 4 * MT; ++i) {
      const int m = acc_row(i, t);
      if (m < M) s[i] = from_bf16(to_bf16(s[i])) + half_of(st.res[m][acc_col(i, g) >> 1], acc_col(i, g));
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
                              void* ws, void* tickets, int M, int Kp, int k_split, long stride_x, long stride_y,
                              int sm_row, int sm_group, int ex_row, int ex_group) {
  // a fused norm stages the normalized rows of the CTA's K range in dynamic shared memory
  const size_t smem = norm_w != nullptr ? (size_t)M * k_split * sizeof(bf16_t) : 0;
  return launch_maybe_pdl(bf12_mma<MT, U, WARPS, P>, grid, WARPS * 32, smem, stream, pdl, (const bf16_t*)x, (const unsigned char*)sm,
                            (const unsigned char*)ex, (const unsigned char*)base, stride_base, (const int*)rowptr,
                            (const int*)ecol, (const float*)etrue, (const float*)efake, (const bf16_t*)bias,
                            (const bf16_t*)norm_w, eps, (const bf16_t*)residual, stride_r, (bf16_t*)y,
                            (float*)ws, (unsigned*)tickets, M, Kp, k_split, stride_x, stride_y, sm_row, sm_group,
                            ex_row, ex_group);
}

void bf12_mma_launch(int mt, int unroll, int warps, bool prefetch, bool pdl, dim3 grid, cudaStream_t stream,
                     const void* x, const void* sm, const void* ex, const void* base, int stride_base,
                     const void* rowptr, const void* ecol, const void* etrue, const void* efake, const void* bias,
                     const void* norm_w, float eps, const void* residual, long stride_r, void* y, void* ws,
                     void* tickets, int M, int Kp, int k_split, long stride_x, long stride_y, int sm_row,
                     int sm_group, int ex_row, int ex_group) {
#define SPECC_BF12_ARGS pdl, grid, stream, x, sm, ex, base, stride_base, rowptr, ecol, etrue, efake, bias, norm_w, \
                        eps, residual, stride_r, y, ws, tickets, M, Kp, k_split, stride_x, stride_y, sm_row, sm_group, \
                        ex_row, ex_group
#define SPECC_BF12_CASE(MT, U, W)                                                                        \
  case MT * 100 + U * 10 + W / 4:                                                                        \
    err = prefetch ? launch_one<MT, U, W, true>(SPECC_BF12_ARGS) : launch_one<MT, U, W, false>(SPECC_BF12_ARGS); \
    break;
  cudaError_t err = cudaErrorInvalidValue;
  switch (mt * 100 + unroll * 10 + warps / 4) {
    SPECC_BF12_CASE(1, 1, 4) SPECC_BF12_CASE(1, 1, 8) SPECC_BF12_CASE(1, 2, 4) SPECC_BF12_CASE(1, 2, 8)
    SPECC_BF12_CASE(2, 1, 4) SPECC_BF12_CASE(2, 1, 8) SPECC_BF12_CASE(2, 2, 4) SPECC_BF12_CASE(2, 2, 8)
    SPECC_BF12_CASE(4, 1, 4) SPECC_BF12_CASE(4, 1, 8) SPECC_BF12_CASE(4, 2, 4) SPECC_BF12_CASE(4, 2, 8)
    default:
      throw std::invalid_argument("bf12_mma: x tiles in {1, 2, 4}, unroll in {1, 2}, warps in {4, 8}");
  }
#undef SPECC_BF12_CASE
#undef SPECC_BF12_ARGS
  if (err != cudaSuccess) throw std::runtime_error(std::string("bf12_mma launch: ") + cudaGetErrorString(err));
}
#endif
