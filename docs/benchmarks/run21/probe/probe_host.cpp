// Host side of linear_bf12_mma.cu: checks, the template instance for (rows, blocks, unroll, warps,
// prefetch), and a launch on torch's current stream, with programmatic dependent launch on request.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

void bf12_mma_launch(int mt, int nb, int unroll, int warps, bool prefetch, bool pdl, dim3 grid, cudaStream_t stream,
                     const void* x, const void* sm, const void* ex, const void* base, int stride_base,
                     const void* rowptr, const void* ecol, const void* etrue, const void* efake, const void* bias,
                     const void* norm_w, float eps, const void* residual, long stride_r, void* y, void* ws,
                     void* tickets, int M, int Kp, int k_split, long stride_x, long stride_y);

void bf12_mma_out(torch::Tensor x, torch::Tensor sm, torch::Tensor ex, torch::Tensor base, int64_t stride_base,
                  torch::Tensor rowptr, torch::Tensor ecol, torch::Tensor etrue, torch::Tensor efake,
                  torch::Tensor bias, bool has_bias, torch::Tensor norm_w, bool has_norm, double eps,
                  torch::Tensor residual, bool has_residual, torch::Tensor y, torch::Tensor ws, torch::Tensor tickets,
                  int64_t splits, int64_t blocks, int64_t unroll, int64_t warps, bool prefetch, bool pdl) {
  const int64_t M = x.size(0), N = sm.size(0), Kp = sm.size(1);
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16, "x: bf16 on the GPU");
  TORCH_CHECK(M >= 1 && M <= 16, "1 .. 16 rows, got ", M);
  TORCH_CHECK(x.size(1) == Kp && x.stride(1) == 1, "x: [M, Kp] with unit column stride");
  TORCH_CHECK(y.size(0) == M && y.size(1) == N && y.stride(1) == 1 && y.scalar_type() == torch::kBFloat16,
              "y: [M, N] bf16 with unit column stride");
  TORCH_CHECK(blocks == 1 || blocks == 2, "blocks: 1 or 2, got ", blocks);
  TORCH_CHECK(N % (16 * blocks) == 0 && Kp % (64 * unroll * splits) == 0,
              "N % (16 * blocks) == 0 and Kp % (64 * unroll * splits) == 0");
  TORCH_CHECK(splits == 1 || (ws.numel() >= splits * (N / 16) * 256 && tickets.numel() >= N / 16),
              "split-K workspace too small");
  TORCH_CHECK(!has_norm || (norm_w.numel() == Kp && norm_w.is_contiguous() &&
                             norm_w.scalar_type() == torch::kBFloat16), "norm weight: Kp contiguous bf16");
  TORCH_CHECK(!has_residual || (residual.size(0) == M && residual.size(1) == N && residual.stride(1) == 1 &&
                                 residual.scalar_type() == torch::kBFloat16), "residual: [M, N] bf16");
  // the epilogue's inputs are staged by 4-byte copies; a fused norm stages the rows in shared memory
  TORCH_CHECK(!has_residual || ((uintptr_t)residual.data_ptr() % 4 == 0 && (M == 1 || residual.stride(0) % 2 == 0)),
              "residual rows: 4-byte aligned");
  TORCH_CHECK(!has_bias || (uintptr_t)bias.data_ptr() % 4 == 0, "bias: 4-byte aligned");
  TORCH_CHECK((uintptr_t)x.data_ptr() % 16 == 0 && (M == 1 || x.stride(0) % 8 == 0), "x rows: 16-byte aligned");
  TORCH_CHECK(!has_norm || M * (Kp / splits) * 2 <= 32768, "fused norm: M * K / splits <= 16384");
  // two blocks' epilogue stages and sums plus the norm's rows would pass the 48 KB of shared memory
  TORCH_CHECK(!has_norm || blocks == 1, "fused norm: one 16-row block per CTA");
  const int mt = M > 8 ? 2 : 1;
  dim3 grid((unsigned)(N / (16 * blocks)), (unsigned)splits);
  bf12_mma_launch(mt, (int)blocks, (int)unroll, (int)warps, prefetch, pdl, grid, at::cuda::getCurrentCUDAStream(),
                  x.data_ptr(), sm.data_ptr(), ex.data_ptr(), base.data_ptr(), (int)stride_base, rowptr.data_ptr(),
                  ecol.data_ptr(), etrue.data_ptr(), efake.data_ptr(), has_bias ? bias.data_ptr() : nullptr,
                  has_norm ? norm_w.data_ptr() : nullptr, (float)eps, has_residual ? residual.data_ptr() : nullptr,
                  has_residual ? (long)residual.stride(0) : 0L,
                  y.data_ptr(), ws.data_ptr(), tickets.data_ptr(), (int)M, (int)Kp, (int)(Kp / splits),
                  (long)x.stride(0), (long)y.stride(0));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf12_mma_out", &bf12_mma_out, "y = x @ W^T (+ bias) on bf12 layout-2 weights, 1 .. 16 rows");
}
