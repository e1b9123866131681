// The w4kernels_simt operator library: the CUDA kernels of csrc/kernels, compiled for the host
// against the SIMT emulator (this file is built with -DW4K_SIMT=1) and registered for CPU
// tensors as torch.ops.w4kernels_simt.<op>. Same schemas (schemas.h) and the same argument
// checks as the CPU and CUDA backends, so results and error messages can be compared 1:1; the
// launches are the very launchers the CUDA bindings call, run block by block, lane by lane.
#include <Python.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "awq_checks.h"
#include "kernels/awq_dequantize.cuh"
#include "kernels/marlin_repack.cuh"
#include "marlin_checks.h"
#include "meta_kernels.h"
#include "schemas.h"
#include "simt/simt_binding.h"

namespace w4k {
namespace {

using simt_binding::kNoStream;
using simt_binding::run_simt;

at::Tensor marlin_repack_simt(const at::Tensor& b_q_weight, const std::optional<at::Tensor>& perm,
                              int64_t size_k, int64_t size_n, int64_t num_bits) {
  check_marlin_repack_args(b_q_weight, perm, size_k, size_n, num_bits, c10::DeviceType::CPU);
  at::Tensor out = at::empty({size_k / 16, 2 * size_n}, b_q_weight.options());
  const bool act_order = has_perm(perm);
  const at::Tensor src = aligned16(b_q_weight);
  run_simt("marlin_repack", [&] {
    return launch_marlin_repack(reinterpret_cast<const uint32_t*>(src.data_ptr<int32_t>()),
                                act_order ? perm->data_ptr<int32_t>() : nullptr,
                                reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), size_k,
                                size_n, kNoStream);
  });
  return out;
}

at::Tensor awq_marlin_repack_simt(const at::Tensor& b_q_weight, int64_t size_k, int64_t size_n,
                                  int64_t num_bits) {
  check_awq_marlin_repack_args(b_q_weight, size_k, size_n, num_bits, c10::DeviceType::CPU);
  at::Tensor out = at::empty({size_k / 16, 2 * size_n}, b_q_weight.options());
  const at::Tensor src = aligned16(b_q_weight);
  run_simt("awq_marlin_repack", [&] {
    return launch_awq_marlin_repack(reinterpret_cast<const uint32_t*>(src.data_ptr<int32_t>()),
                                    reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), size_k,
                                    size_n, kNoStream);
  });
  return out;
}

// As the CUDA binding: split_k_iters is ignored, thx/thy (both positive) set the block shape.
at::Tensor awq_dequantize_simt(const at::Tensor& qweight, const at::Tensor& scales,
                               const at::Tensor& qzeros, int64_t split_k_iters, int64_t thx,
                               int64_t thy) {
  (void)split_k_iters;
  check_awq_dequantize_args(qweight, scales, qzeros, c10::DeviceType::CPU);
  const int64_t size_k = qweight.size(0), size_n = 8 * qweight.size(1);
  const int64_t group_size = size_k / scales.size(0);
  at::Tensor out = at::empty({size_k, size_n}, scales.options());
  const at::Tensor scales16 = aligned16(scales);
  const int block_x = thx > 0 && thx <= 1024 ? static_cast<int>(thx) : 0;
  const int block_y = thy > 0 && thy <= 1024 ? static_cast<int>(thy) : 0;
  const auto* q = reinterpret_cast<const uint32_t*>(qweight.data_ptr<int32_t>());
  const auto* z = reinterpret_cast<const uint32_t*>(qzeros.data_ptr<int32_t>());
  run_simt("awq_dequantize", [&] {
    if (scales.scalar_type() == at::kHalf) {
      return launch_awq_dequantize<half>(
          q, reinterpret_cast<const half*>(scales16.data_ptr<at::Half>()), z,
          reinterpret_cast<half*>(out.data_ptr<at::Half>()), size_k, size_n, group_size, block_x,
          block_y, kNoStream);
    }
    return launch_awq_dequantize<__nv_bfloat16>(
        q, reinterpret_cast<const __nv_bfloat16*>(scales16.data_ptr<at::BFloat16>()), z,
        reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>()), size_k, size_n,
        group_size, block_x, block_y, kNoStream);
  });
  return out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY(w4kernels_simt, m) { w4k::define_ops(m); }

TORCH_LIBRARY_IMPL(w4kernels_simt, CPU, m) {
  m.impl("marlin_repack", &w4k::marlin_repack_simt);
  m.impl("awq_marlin_repack", &w4k::awq_marlin_repack_simt);
  m.impl("awq_dequantize", &w4k::awq_dequantize_simt);
}

// The same Meta kernels as w4kernels (meta_kernels.h): the emulator namespace's fakes.
TORCH_LIBRARY_IMPL(w4kernels_simt, Meta, m) { w4k::meta::register_marlin_awq_meta(m); }

// `import w4kernels._simt` loads this shared object, which runs the registrations above.
extern "C" PyObject* PyInit__simt(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_simt",
                               "w4kernels CUDA kernels under the SIMT emulator", -1, nullptr};
  return PyModule_Create(&module);
}
