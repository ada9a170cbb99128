// Host side of linear_bf12_mma.cu: checks, the template instance for (rows, unroll, warps,
// prefetch), and a launch on torch's current stream, with programmatic dependent launch on request.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

void bf12_mma_launch(int mt, int unroll, int warps, bool prefetch, bool pdl, dim3 grid, cudaStream_t stream,
                     const void* x, const void* sm, const void* ex, const void* base, int stride_base,
                     const void* rowptr, const void* ecol, const void* etrue, const void* efake, const void* bias,
                     const void* norm_w, float eps, const void* residual, long stride_r, void* y, void* ws,
                     void* tickets, int M, int Kp, int k_split, long stride_x, long stride_y, int sm_row,
                     int sm_group, int ex_row, int ex_group);

void bf12_mma_out(torch::Tensor x, torch::Tensor sm, torch::Tensor ex, torch::Tensor base, int64_t stride_base,
                  torch::Tensor rowptr, torch::Tensor ecol, torch::Tensor etrue, torch::Tensor efake,
                  torch::Tensor bias, bool has_bias, torch::Tensor norm_w, bool has_norm, double eps,
                  torch::Tensor residual, bool has_residual, torch::Tensor y, torch::Tensor ws, torch::Tensor tickets,
                  int64_t sm_row, int64_t sm_group, int64_t ex_row, int64_t ex_group,
                  int64_t splits, int64_t unroll, int64_t warps, bool prefetch, bool pdl) {
  const int64_t M = x.size(0), N = sm.size(0), Kp = sm.size(1);
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16, "x: bf16 on the GPU");
  TORCH_CHECK(M >= 1 && M <= 32, "1 .. 32 rows, got ", M);
  const int mt = M > 16 ? 4 : M > 8 ? 2 : 1;  // 8-row x tiles
  TORCH_CHECK(x.size(1) == Kp && x.stride(1) == 1, "x: [M, Kp] with unit column stride");
  TORCH_CHECK(y.size(0) == M && y.size(1) == N && y.stride(1) == 1 && y.scalar_type() == torch::kBFloat16,
              "y: [M, N] bf16 with unit column stride");
  TORCH_CHECK(N % 16 == 0 && Kp % (64 * unroll * splits) == 0, "N % 16 == 0 and Kp % (64 * unroll * splits) == 0");
  TORCH_CHECK(splits == 1 || (ws.numel() >= splits * (N / 16) * 32 * 4 * mt && tickets.numel() >= N / 16),
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
  // (the 32-row instance's static shared memory is ~12 KB larger: half the stage)
  TORCH_CHECK(!has_norm || M * (Kp / splits) * 2 <= (mt == 4 ? 16384 : 32768),
              "fused norm: M * K / splits <= 16384 (8192 above 16 rows)");
  // the layout's strides (bf12.plane_strides): 2 (rows of Kp bytes) or 3 (16 x 64 tiles)
  TORCH_CHECK((sm_row == Kp && sm_group == 64 && ex_row == Kp / 2 && ex_group == 32) ||
              (sm_row == 64 && sm_group == 1024 && ex_row == 32 && ex_group == 512), "plane strides of layout 2 or 3");
  dim3 grid((unsigned)(N / 16), (unsigned)splits);
  bf12_mma_launch(mt, (int)unroll, (int)warps, prefetch, pdl, grid, at::cuda::getCurrentCUDAStream(),
                  x.data_ptr(), sm.data_ptr(), ex.data_ptr(), base.data_ptr(), (int)stride_base, rowptr.data_ptr(),
                  ecol.data_ptr(), etrue.data_ptr(), efake.data_ptr(), has_bias ? bias.data_ptr() : nullptr,
                  has_norm ? norm_w.data_ptr() : nullptr, (float)eps, has_residual ? residual.data_ptr() : nullptr,
                  has_residual ? (long)residual.stride(0) : 0L,
                  y.data_ptr(), ws.data_ptr(), tickets.data_ptr(), (int)M, (int)Kp, (int)(Kp / splits),
                  (long)x.stride(0), (long)y.stride(0), (int)sm_row, (int)sm_group, (int)ex_row, (int)ex_group);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf12_mma_out", &bf12_mma_out, "y = [residual +] [rms_norm](x) @ W^T (+ bias) on bf12 layout-2/3 weights, 1 .. 32 rows");
}
