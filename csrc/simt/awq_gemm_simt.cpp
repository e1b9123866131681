// awq_gemm under the SIMT emulator: the CUDA kernels of kernels/awq_gemm.cuh compiled for the
// host (-DW4K_SIMT=1), registered for CPU tensors as torch.ops.w4kernels_simt.awq_gemm with the
// CPU backend's argument checks (identical messages). From the token threshold on, the emulated
// awq_dequantize kernel and a CPU at::matmul, as the CUDA binding does on the GPU.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>

#include "awq_checks.h"
#include "awq_gemm_launch.h"
#include "simt/simt_binding.h"

namespace w4k {
namespace {

at::Tensor awq_gemm_simt(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                         const at::Tensor& qzeros, c10::SymInt split_k_iters) {
  const int64_t split = split_k_iters.expect_int();
  check_awq_gemm_args(x, qweight, scales, qzeros, split, c10::DeviceType::CPU);
  at::Tensor out = at::empty({x.size(0), 8 * qweight.size(1)}, x.options());
  if (x.size(0) == 0) return out;
  if (x.size(0) >= awq_gemm_dequant_threshold()) {  // many tokens: emulated dequantize + CPU GEMM
    at::Tensor w = at::empty({qweight.size(0), 8 * qweight.size(1)}, scales.options());
    simt_binding::run_simt("awq_gemm", [&] {
      return awq_gemm_dequantize_weight(qweight, scales, qzeros, w, simt_binding::kNoStream);
    });
    return at::matmul(x, w);
  }
  simt_binding::run_simt("awq_gemm", [&] {
    return awq_gemm_launch(x, qweight, scales, qzeros, split, out, simt_binding::kNoStream);
  });
  return out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels_simt, CPU, m) { m.impl("awq_gemm", &w4k::awq_gemm_simt); }
