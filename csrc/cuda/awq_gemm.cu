// CUDA binding of awq_gemm: argument checks (shared with the CPU and SIMT backends), device
// guard, stream, and the launch of kernels/awq_gemm.cuh (split-K partials summed in fp32).
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
  const cudaError_t err =
      awq_gemm_launch(x, qweight, scales, qzeros, split, out, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "awq_gemm: CUDA kernel launch failed: ",
              cudaGetErrorString(err));
  return out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels, CUDA, m) { m.impl("awq_gemm", &w4k::awq_gemm_cuda); }
