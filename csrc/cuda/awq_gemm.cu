// CUDA binding of awq_gemm: argument checks (shared with the CPU and SIMT backends), device
// guard, stream; below the token threshold (awq_gemm_launch.h) the tensor-core kernel of
// kernels/awq_gemm.cuh, from it on awq_dequantize + at::matmul (vLLM's dispatch).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>

#include "awq_checks.h"
#include "awq_gemm_launch.h"

namespace w4k {
namespace {

at::Tensor awq_gemm_cuda(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                         const at::Tensor& qzeros, c10::SymInt split_k_iters) {
  const int64_t split = split_k_iters.expect_int();
  check_awq_gemm_args(x, qweight, scales, qzeros, split, c10::DeviceType::CUDA);
  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor out = at::empty({x.size(0), 8 * qweight.size(1)}, x.options());
  if (x.size(0) == 0) return out;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (x.size(0) >= awq_gemm_dequant_threshold()) {  // many tokens: dequantize once + GEMM
    at::Tensor w = at::empty({qweight.size(0), 8 * qweight.size(1)}, scales.options());
    const cudaError_t err = awq_gemm_dequantize_weight(qweight, scales, qzeros, w, stream);
    TORCH_CHECK(err == cudaSuccess,
                "awq_gemm: CUDA kernel launch failed: ", cudaGetErrorString(err));
    return at::matmul(x, w);
  }
  const cudaError_t err = awq_gemm_launch(x, qweight, scales, qzeros, split, out, stream);
  TORCH_CHECK(err == cudaSuccess, "awq_gemm: CUDA kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels, CUDA, m) { m.impl("awq_gemm", &w4k::awq_gemm_cuda); }
