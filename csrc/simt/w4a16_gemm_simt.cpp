// w4a16_gemm under the SIMT emulator: the CUDA kernel of kernels/w4a16_gemm.cuh compiled for the
// host (-DW4K_SIMT=1), registered for CPU tensors as torch.ops.w4kernels_simt.w4a16_gemm with
// the CPU backend's argument checks (identical messages).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "kernels/w4a16_gemm.cuh"
#include "simt/simt_binding.h"
#include "w4a16_checks.h"
#include "w4a16_launch_args.h"

namespace w4k {
namespace {

at::Tensor w4a16_gemm_simt(const at::Tensor& a, const at::Tensor& b_q_weight,
                           const at::Tensor& b_scales, const std::optional<at::Tensor>& b_zeros,
                           const std::optional<at::Tensor>& g_idx,
                           const std::optional<at::Tensor>& perm, at::Tensor& workspace,
                           int64_t num_bits, int64_t size_m, int64_t size_n, int64_t size_k,
                           bool is_k_full, const std::optional<at::Tensor>& b_bias,
                           bool use_fp32_reduce) {
  (void)use_fp32_reduce;  // split-K partial sums are always added in fp32
  const W4a16GemmArgs args =
      check_w4a16_gemm_args(a, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace, num_bits,
                            size_m, size_n, size_k, is_k_full, b_bias, c10::DeviceType::CPU);
  // The plan sees the emulated device: W4K_SIMT_SMS SMs (8) with sm_80 occupancy limits.
  int num_sms = 0;
  cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0);
  const W4a16LaunchTensors t = w4a16_prepare_for_dtype(a, b_q_weight, b_scales, g_idx, perm,
                                                        workspace, args, size_m, size_n, size_k,
                                                        num_sms);
  if (size_m == 0) return t.out;
  simt_binding::run_simt("w4a16_gemm", [&] {
    return launch_w4a16_for_dtype(a, t, b_zeros, b_bias, args, size_m, size_n, size_k,
                                  simt_binding::kNoStream);
  });
  w4a16_finish(t, b_bias);
  return t.out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels_simt, CPU, m) { m.impl("w4a16_gemm", &w4k::w4a16_gemm_simt); }
