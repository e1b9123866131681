// Meta kernels of the Marlin and AWQ ops: the very argument checks the CPU, CUDA and SIMT
// bindings call (marlin_checks.h, awq_checks.h, w4a16_checks.h), then an empty output of the
// real op's shape and dtype. Registered for both namespaces (meta.cpp: w4kernels,
// simt/ops_simt.cpp: w4kernels_simt); FakeTensorMode and torch.compile use them as the ops'
// fakes, so a bad argument fails at trace time with the kernel's message.
//
// The expected device (served_device) is the first argument's that is not on meta, else meta:
// all-meta calls pass, and a meta tensor mixed with CPU (or CUDA) ones fails exactly as the CPU
// (or CUDA) kernel fails for that mix, with its message. Under FakeTensorMode every argument
// looks like a meta tensor here; a fake-device mix is then reported by FakeTensorMode itself.
// What a Meta kernel cannot check: values (perm is a permutation, g_idx sorted and in range,
// workspace zero), which the host bindings check on the data.
//
// SymInt arguments stay symbolic where the batch dimension can be dynamic (size_m, x's and a's
// rows); weight sizes are specialized (guard_int), as the kernels pick tilings from them.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#include "awq_checks.h"
#include "marlin_checks.h"
#include "w4a16_checks.h"

namespace w4k {
namespace meta {

inline c10::DeviceType served_device(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors)
    if (t != nullptr && t->defined() && t->device().type() != c10::kMeta) return t->device().type();
  return c10::kMeta;
}

inline const at::Tensor* maybe(const std::optional<at::Tensor>& t) {
  return t.has_value() ? &*t : nullptr;
}

inline int64_t concrete(const c10::SymInt& v) { return v.guard_int(__FILE__, __LINE__); }

inline at::TensorOptions meta_options(const at::Tensor& like, c10::ScalarType dtype) {
  return like.options().dtype(dtype).device(c10::kMeta);
}

inline at::Tensor marlin_repack(const at::Tensor& b_q_weight,
                                const std::optional<at::Tensor>& perm, c10::SymInt size_k_s,
                                c10::SymInt size_n_s, int64_t num_bits) {
  const int64_t size_k = concrete(size_k_s), size_n = concrete(size_n_s);
  check_marlin_repack_args(b_q_weight, perm, size_k, size_n, num_bits,
                           served_device({&b_q_weight, maybe(perm)}));
  return at::empty({size_k / 16, 2 * size_n}, meta_options(b_q_weight, at::kInt));
}

inline at::Tensor awq_marlin_repack(const at::Tensor& b_q_weight, c10::SymInt size_k_s,
                                    c10::SymInt size_n_s, int64_t num_bits) {
  const int64_t size_k = concrete(size_k_s), size_n = concrete(size_n_s);
  check_awq_marlin_repack_args(b_q_weight, size_k, size_n, num_bits, served_device({&b_q_weight}));
  return at::empty({size_k / 16, 2 * size_n}, meta_options(b_q_weight, at::kInt));
}

inline at::Tensor awq_dequantize(const at::Tensor& qweight, const at::Tensor& scales,
                                 const at::Tensor& qzeros, c10::SymInt split_k_iters, int64_t thx,
                                 int64_t thy) {
  check_awq_dequantize_args(qweight, scales, qzeros, served_device({&qweight, &scales, &qzeros}));
  return at::empty_symint({qweight.sym_size(0), 8 * qweight.sym_size(1)},
                          meta_options(scales, scales.scalar_type()));
}

inline at::Tensor awq_gemm(const at::Tensor& x, const at::Tensor& qweight,
                           const at::Tensor& scales, const at::Tensor& qzeros,
                           c10::SymInt split_k_iters) {
  check_awq_gemm_args(x, qweight, scales, qzeros, concrete(split_k_iters),
                      served_device({&x, &qweight, &scales, &qzeros}));
  return at::empty_symint({x.sym_size(0), 8 * qweight.sym_size(1)},
                          meta_options(x, x.scalar_type()));
}

inline at::Tensor w4a16_gemm(const at::Tensor& a, const at::Tensor& b_q_weight,
                             const at::Tensor& b_scales, const std::optional<at::Tensor>& b_zeros,
                             const std::optional<at::Tensor>& g_idx,
                             const std::optional<at::Tensor>& perm, at::Tensor& workspace,
                             int64_t num_bits, c10::SymInt size_m, c10::SymInt size_n_s,
                             c10::SymInt size_k_s, bool is_k_full,
                             const std::optional<at::Tensor>& b_bias, bool use_fp32_reduce) {
  const int64_t size_n = concrete(size_n_s), size_k = concrete(size_k_s);
  check_w4a16_gemm_args(a, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace, num_bits,
                        size_m, size_n, size_k, is_k_full, b_bias,
                        served_device({&a, &b_q_weight, &b_scales, maybe(b_zeros), maybe(g_idx),
                                       maybe(perm), &workspace, maybe(b_bias)}));
  return at::empty_symint({size_m, size_n}, meta_options(a, a.scalar_type()));
}

inline void register_marlin_awq_meta(torch::Library& m) {
  m.impl("marlin_repack", &marlin_repack);
  m.impl("awq_marlin_repack", &awq_marlin_repack);
  m.impl("awq_dequantize", &awq_dequantize);
  m.impl("awq_gemm", &awq_gemm);
  m.impl("w4a16_gemm", &w4a16_gemm);
}

}  // namespace meta
}  // namespace w4k
