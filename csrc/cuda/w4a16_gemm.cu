// CUDA binding of w4a16_gemm: argument checks (shared with the CPU and SIMT backends, so
// messages are identical), dtype dispatch, device guard, stream, and the launch of the
// torch-free kernel in kernels/w4a16_gemm.cuh.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "kernels/w4a16_gemm.cuh"
#include "w4a16_checks.h"
#include "w4a16_launch_args.h"

namespace w4k {
namespace {

// Split-K, tile configuration and grid come from the kernel's planner (occupancy API x SMs);
// partial sums are always added in fp32 (use_fp32_reduce is accepted and ignored).
at::Tensor w4a16_gemm_cuda(const at::Tensor& a, const at::Tensor& b_q_weight,
                           const at::Tensor& b_scales, const std::optional<at::Tensor>& b_zeros,
                           const std::optional<at::Tensor>& g_idx,
                           const std::optional<at::Tensor>& perm, at::Tensor& workspace,
                           int64_t num_bits, int64_t size_m, int64_t size_n, int64_t size_k,
                           bool is_k_full, const std::optional<at::Tensor>& b_bias,
                           bool use_fp32_reduce) {
  (void)use_fp32_reduce;
  const W4a16GemmArgs args =
      check_w4a16_gemm_args(a, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace, num_bits,
                            size_m, size_n, size_k, is_k_full, b_bias, c10::DeviceType::CUDA);
  const c10::cuda::CUDAGuard device_guard(a.device());
  const int num_sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const W4a16LaunchTensors t = w4a16_prepare_for_dtype(a, b_q_weight, b_scales, g_idx, perm,
                                                        workspace, args, size_m, size_n, size_k,
                                                        num_sms);
  if (size_m == 0) return t.out;
  const cudaError_t err = launch_w4a16_for_dtype(a, t, b_zeros, b_bias, args, size_m, size_n,
                                                 size_k, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess,
              "w4a16_gemm: CUDA kernel launch failed: ", cudaGetErrorString(err));
  w4a16_finish(t, b_bias);
  return t.out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels, CUDA, m) { m.impl("w4a16_gemm", &w4k::w4a16_gemm_cuda); }
