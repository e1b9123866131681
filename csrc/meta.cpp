// Meta kernels of every tensor op of w4kernels (the size and ISA queries take no tensors and are
// registered for every backend in cpu/kleidiai_ops.cpp). Marlin / AWQ: meta_kernels.h, shared
// with the emulator namespace. KleidiAI below: kleidiai_checks.h, the CPU binding's checks.
// There are no Python fakes: FakeTensorMode and torch.compile run these.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#include "kleidiai_checks.h"
#include "meta_kernels.h"
#include "w4a8_checks.h"

namespace w4k {
namespace meta {
namespace {

at::Tensor packed_bytes(const at::Tensor& like, const c10::SymInt& size) {
  return at::empty_symint({size}, meta_options(like, at::kByte));
}

template <bool kKxn>
at::Tensor rhs_pack_qsi4cxp(const at::Tensor& rhs, const at::Tensor& scale,
                            const std::optional<at::Tensor>& bias, int64_t n, int64_t k,
                            int64_t nr, int64_t kr, int64_t sr, int64_t rhs_zero_point) {
  check_rhs_pack_qsi4cxp_args(kKxn ? "rhs_pack_kxn_qsi4cxp_qs4cxs1s0"
                                   : "rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
                              kKxn, rhs, scale, bias, n, k, nr, kr, sr, rhs_zero_point,
                              served_device({&rhs, &scale, maybe(bias)}));
  return packed_bytes(rhs, kai::rhs_packed_size_qsi4cxp(n, k, nr));
}

template <bool kKxn>
at::Tensor rhs_pack_qsi4c32p(const at::Tensor& rhs, const at::Tensor& scale,
                             const std::optional<at::Tensor>& bias, int64_t n, int64_t k,
                             int64_t bl, int64_t nr, int64_t kr, int64_t sr) {
  check_rhs_pack_qsi4c32p_args(kKxn ? "rhs_pack_kxn_qsi4c32p_qsu4c32s1s0"
                                    : "rhs_pack_nxk_qsi4c32p_qsu4c32s1s0",
                               kKxn, rhs, scale, bias, n, k, bl, nr, kr, sr,
                               served_device({&rhs, &scale, maybe(bias)}));
  return packed_bytes(rhs, kai::rhs_packed_size_qsi4c32p(n, k, nr, bl));
}

at::Tensor lhs_quant_pack_qai8dxp_f32(const at::Tensor& lhs, int64_t mr, int64_t kr, int64_t sr) {
  check_lhs_quant_pack_args(lhs, mr, kr, sr, served_device({&lhs}));
  // kai::lhs_packed_size_qai8dxp with a symbolic m: one stride per group of mr rows.
  const c10::SymInt groups = (lhs.sym_size(0) + mr - 1) / mr;
  return packed_bytes(lhs, groups * kai::lhs_packed_stride_qai8dxp(concrete(lhs.sym_size(1)), mr));
}

template <bool kPerBlock>
at::Tensor matmul(const at::Tensor& lhs_packed, const at::Tensor& rhs_packed, int64_t m,
                  int64_t n, int64_t k, int64_t bl, int64_t mr, int64_t nr, int64_t kr, int64_t sr,
                  std::optional<double> clamp_min, std::optional<double> clamp_max,
                  std::optional<at::ScalarType> out_dtype, c10::string_view isa) {
  const char* op = kPerBlock ? "matmul_clamp_f32_qai8dxp_qsi4c32p"
                             : "matmul_clamp_f32_qai8dxp_qsi4cxp";
  check_kai_matmul_args(op, lhs_packed, rhs_packed, m, n, k, kPerBlock, bl, mr, nr, kr, sr,
                        clamp_min, clamp_max, out_dtype, served_device({&lhs_packed, &rhs_packed}));
  resolve_kleidiai_isa(op, isa);
  return at::empty({m, n}, meta_options(lhs_packed, out_dtype.value_or(at::kFloat)));
}

at::Tensor matmul_qsi4cxp(const at::Tensor& lhs_packed, const at::Tensor& rhs_packed, int64_t m,
                          int64_t n, int64_t k, int64_t mr, int64_t nr, int64_t kr, int64_t sr,
                          std::optional<double> clamp_min, std::optional<double> clamp_max,
                          std::optional<at::ScalarType> out_dtype, c10::string_view isa) {
  return matmul<false>(lhs_packed, rhs_packed, m, n, k, 0, mr, nr, kr, sr, clamp_min, clamp_max,
                       out_dtype, isa);
}

at::Tensor dyn_quant_pack_4bit_weight(const at::Tensor& weights, const at::Tensor& scales_zeros,
                                      const std::optional<at::Tensor>& bias, int64_t block_size,
                                      int64_t in_features, int64_t out_features) {
  check_dyn_quant_pack_args(weights, scales_zeros, bias, block_size, in_features, out_features,
                            served_device({&weights, &scales_zeros, maybe(bias)}));
  const int64_t k = in_features, n = out_features;
  return packed_bytes(weights, block_size == k
                                   ? kai::rhs_packed_size_qsi4cxp(n, k, kDynNr)
                                   : kai::rhs_packed_size_qsi4c32p(n, k, kDynNr, block_size));
}

at::Tensor dyn_quant_matmul_4bit(const at::Tensor& inp, const at::Tensor& packed_weights,
                                 int64_t block_size, int64_t in_features, int64_t out_features,
                                 c10::string_view isa) {
  check_dyn_quant_matmul_args(inp, packed_weights, block_size, in_features, out_features,
                              served_device({&inp, &packed_weights}));
  resolve_kleidiai_isa("dyn_quant_matmul_4bit", isa);
  std::vector<c10::SymInt> shape(inp.sym_sizes().begin(), inp.sym_sizes().end());
  shape.back() = out_features;
  return at::empty_symint(shape, meta_options(inp, inp.scalar_type()));
}

at::Tensor w4a8_gemm(const at::Tensor& a, const at::Tensor& b_q_weight,
                     const at::Tensor& b_scales, const std::optional<at::Tensor>& b_zeros,
                     const std::optional<at::Tensor>& g_idx, const std::optional<at::Tensor>& perm,
                     int64_t num_bits, c10::SymInt size_m, c10::SymInt size_n_s,
                     c10::SymInt size_k_s, bool is_k_full, const std::optional<at::Tensor>& b_bias) {
  const int64_t size_n = concrete(size_n_s), size_k = concrete(size_k_s);
  check_w4a8_gemm_args(a, b_q_weight, b_scales, b_zeros, g_idx, perm, num_bits, size_m, size_n,
                       size_k, is_k_full, b_bias,
                       served_device({&a, &b_q_weight, &b_scales, maybe(b_zeros), maybe(g_idx),
                                      maybe(perm), maybe(b_bias)}));
  return at::empty_symint({size_m, size_n}, meta_options(a, a.scalar_type()));
}

at::Tensor awq_gemm_a8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                       const at::Tensor& qzeros) {
  check_awq_gemm_a8_args(x, qweight, scales, qzeros, served_device({&x, &qweight, &scales, &qzeros}));
  return at::empty_symint({x.sym_size(0), 8 * qweight.sym_size(1)},
                          meta_options(x, x.scalar_type()));
}

}  // namespace
}  // namespace meta
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels, Meta, m) {
  using namespace w4k::meta;
  register_marlin_awq_meta(m);
  m.impl("rhs_pack_nxk_qsi4cxp_qs4cxs1s0", &rhs_pack_qsi4cxp<false>);
  m.impl("rhs_pack_kxn_qsi4cxp_qs4cxs1s0", &rhs_pack_qsi4cxp<true>);
  m.impl("rhs_pack_nxk_qsi4c32p_qsu4c32s1s0", &rhs_pack_qsi4c32p<false>);
  m.impl("rhs_pack_kxn_qsi4c32p_qsu4c32s1s0", &rhs_pack_qsi4c32p<true>);
  m.impl("lhs_quant_pack_qai8dxp_f32", &lhs_quant_pack_qai8dxp_f32);
  m.impl("matmul_clamp_f32_qai8dxp_qsi4cxp", &matmul_qsi4cxp);
  m.impl("matmul_clamp_f32_qai8dxp_qsi4c32p", &matmul<true>);
  m.impl("dyn_quant_pack_4bit_weight", &dyn_quant_pack_4bit_weight);
  m.impl("dyn_quant_matmul_4bit", &dyn_quant_matmul_4bit);
  m.impl("w4a8_gemm", &w4a8_gemm);
  m.impl("awq_gemm_a8", &awq_gemm_a8);
}
