// CPU bindings of the KleidiAI-format ops: argument checks, allocation, threading. The kernels
// (kleidiai_pack.cpp, kleidiai_matmul.cpp) only see raw pointers; formats in kleidiai.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cpu/w4a16_gemm_work_queue.h"
#include "kleidiai_checks.h"

namespace w4k {
namespace {

using kai::Isa;

void check_sizes(const char* op, int64_t n, int64_t k) { check_kai_sizes(op, n, k); }

// fn(begin, end) over [0, n) in contiguous pieces of >= grain indices, `per_thread` pieces per
// thread at most, on the CPU GEMMs' work queue (cpu/w4a16_gemm_work_queue.h), as the Marlin and
// AWQ GEMMs run: a thread that is late or preempted holds up only the piece it claimed, and a
// sleeping worker is woken off the caller's CPU. (at::parallel_for's region waits at its end
// for every team thread, started or not.)
template <class F>
void parallel_pieces(int64_t n, int64_t grain, int64_t per_thread, const F& fn) {
  if (n <= 0) return;
  const int threads = at::get_num_threads();
  const int64_t pieces =
      std::max<int64_t>(1, std::min((n + grain - 1) / grain, threads * per_thread));
  cpu::WorkQueue::instance().run(pieces, threads, [&](int64_t i) {
    fn(i * n / pieces, (i + 1) * n / pieces);
  });
}

// ---- sizes ------------------------------------------------------------------------------

int64_t rhs_packed_size_qsi4cxp(int64_t n, int64_t k, int64_t nr, int64_t kr, int64_t sr) {
  const char* op = "rhs_packed_size_qsi4cxp";
  check_sizes(op, n, k);
  check_nr_kr_sr(op, nr, kr, sr);
  return kai::rhs_packed_size_qsi4cxp(n, k, nr);
}

int64_t rhs_packed_size_qsi4c32p(int64_t n, int64_t k, int64_t bl, int64_t nr, int64_t kr,
                                 int64_t sr) {
  const char* op = "rhs_packed_size_qsi4c32p";
  check_sizes(op, n, k);
  check_nr_kr_sr(op, nr, kr, sr);
  check_block(op, k, nr, kr, bl);
  return kai::rhs_packed_size_qsi4c32p(n, k, nr, bl);
}

int64_t lhs_packed_size_qai8dxp(int64_t m, int64_t k, int64_t mr, int64_t kr, int64_t sr) {
  const char* op = "lhs_packed_size_qai8dxp";
  check_m_mr(op, m, mr);
  check_positive(op, "k", k);
  check_dim_bound(op, "k", k);
  check_nr_kr_sr(op, 1, kr, sr);
  return kai::lhs_packed_size_qai8dxp(m, k, mr);
}

// ---- packers ------------------------------------------------------------------------------

at::Tensor pack_qsi4cxp(const char* op, bool kxn, const at::Tensor& rhs, const at::Tensor& scale,
                        const std::optional<at::Tensor>& bias, int64_t n, int64_t k, int64_t nr,
                        int64_t kr, int64_t sr, int64_t rhs_zero_point) {
  check_rhs_pack_qsi4cxp_args(op, kxn, rhs, scale, bias, n, k, nr, kr, sr, rhs_zero_point,
                              c10::DeviceType::CPU);
  at::Tensor out = at::empty({kai::rhs_packed_size_qsi4cxp(n, k, nr)}, rhs.options());
  kai::rhs_pack_qsi4cxp(kxn, n, k, nr, kr, sr, rhs.data_ptr<uint8_t>(), scale.data_ptr<float>(),
                        bias ? bias->data_ptr<float>() : nullptr, rhs_zero_point,
                        out.data_ptr<uint8_t>());
  return out;
}

at::Tensor pack_qsi4c32p(const char* op, bool kxn, const at::Tensor& rhs, const at::Tensor& scale,
                         const std::optional<at::Tensor>& bias, int64_t n, int64_t k, int64_t bl,
                         int64_t nr, int64_t kr, int64_t sr) {
  check_rhs_pack_qsi4c32p_args(op, kxn, rhs, scale, bias, n, k, bl, nr, kr, sr,
                               c10::DeviceType::CPU);
  at::Tensor out = at::empty({kai::rhs_packed_size_qsi4c32p(n, k, nr, bl)}, rhs.options());
  kai::rhs_pack_qsi4c32p(kxn, n, k, nr, kr, sr, bl, rhs.data_ptr<uint8_t>(),
                         reinterpret_cast<const uint16_t*>(scale.data_ptr<at::BFloat16>()),
                         bias ? bias->data_ptr<float>() : nullptr, out.data_ptr<uint8_t>());
  return out;
}

at::Tensor rhs_pack_nxk_qsi4cxp(const at::Tensor& rhs, const at::Tensor& scale,
                                const std::optional<at::Tensor>& bias, int64_t n, int64_t k,
                                int64_t nr, int64_t kr, int64_t sr, int64_t zp) {
  return pack_qsi4cxp("rhs_pack_nxk_qsi4cxp_qs4cxs1s0", false, rhs, scale, bias, n, k, nr, kr, sr, zp);
}
at::Tensor rhs_pack_kxn_qsi4cxp(const at::Tensor& rhs, const at::Tensor& scale,
                                const std::optional<at::Tensor>& bias, int64_t n, int64_t k,
                                int64_t nr, int64_t kr, int64_t sr, int64_t zp) {
  return pack_qsi4cxp("rhs_pack_kxn_qsi4cxp_qs4cxs1s0", true, rhs, scale, bias, n, k, nr, kr, sr, zp);
}
at::Tensor rhs_pack_nxk_qsi4c32p(const at::Tensor& rhs, const at::Tensor& scale,
                                 const std::optional<at::Tensor>& bias, int64_t n, int64_t k,
                                 int64_t bl, int64_t nr, int64_t kr, int64_t sr) {
  return pack_qsi4c32p("rhs_pack_nxk_qsi4c32p_qsu4c32s1s0", false, rhs, scale, bias, n, k, bl, nr, kr, sr);
}
at::Tensor rhs_pack_kxn_qsi4c32p(const at::Tensor& rhs, const at::Tensor& scale,
                                 const std::optional<at::Tensor>& bias, int64_t n, int64_t k,
                                 int64_t bl, int64_t nr, int64_t kr, int64_t sr) {
  return pack_qsi4c32p("rhs_pack_kxn_qsi4c32p_qsu4c32s1s0", true, rhs, scale, bias, n, k, bl, nr, kr, sr);
}

// op, name: who to blame for a non-finite value (check_finite_rows, run per task on its rows).
void quant_pack_lhs_into(const char* op, const char* name, const at::Tensor& lhs2d, int64_t mr,
                         int64_t kr, int64_t sr, uint8_t* out) {
  const int64_t m = lhs2d.size(0), k = lhs2d.size(1);
  const float* x = lhs2d.data_ptr<float>();
  const int64_t stride = lhs2d.stride(0);
  // Whole mr-groups per task, so no two threads write the same group's parameter slots
  // (they would not overlap anyway; this keeps each task's writes contiguous).
  const int64_t groups = kai::roundup(m, mr) / mr;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, mr * k));
  parallel_pieces(groups, grain, 4, [&](int64_t g0, int64_t g1) {
    check_finite_rows(op, name, lhs2d, g0 * mr, std::min(m, g1 * mr));
    kai::lhs_quant_pack_qai8dxp(g0 * mr, std::min(m, g1 * mr), k, mr, kr, sr, x, stride, out);
  });
}

at::Tensor lhs_quant_pack_qai8dxp_f32(const at::Tensor& lhs, int64_t mr, int64_t kr, int64_t sr) {
  check_lhs_quant_pack_args(lhs, mr, kr, sr, c10::DeviceType::CPU);
  const int64_t m = lhs.size(0), k = lhs.size(1);
  // Zero-filled: the slots of rows >= m in the last mr-group are not written.
  at::Tensor out = at::zeros({kai::lhs_packed_size_qai8dxp(m, k, mr)}, lhs.options().dtype(at::kByte));
  quant_pack_lhs_into("lhs_quant_pack_qai8dxp_f32", "lhs", lhs, mr, kr, sr,
                      out.data_ptr<uint8_t>());
  return out;
}

// ---- matmul ---------------------------------------------------------------------------------

// rhs_name: the caller's name of the packed RHS, for check_rhs_packed_values.
void run_matmul(const char* op, const char* rhs_name, Isa isa, const kai::MatmulArgs& a0) {
  kai::MatmulArgs a = a0;
  const int64_t nkb = kai::num_kblocks(a);
  at::Tensor sums = at::empty({std::max<int64_t>(a.m, 1) * nkb}, at::kInt);
  a.lhs_sums = sums.data_ptr<int32_t>();
  parallel_pieces(a.m, std::max<int64_t>(1, 8192 / a.k), 4, [&](int64_t b, int64_t e) {
    kai::lhs_block_sums(a, b, e, sums.data_ptr<int32_t>());
  });
  // Work items: (64-row M chunk, nr-block), nr-blocks fastest, in 4 contiguous pieces per
  // thread (so at M <= 64 threads split N and every weight byte is read once; 4 pieces rather
  // than 1: 1.0-1.1x back to back, and a thread slowed by other processes holds up less).
  const int64_t num_nb = kai::roundup(a.n, a.nr) / a.nr;
  const int64_t num_mc = (a.m + 63) / 64;
  parallel_pieces(num_mc * num_nb, 1, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e;) {
      const int64_t mc = i / num_nb, nb0 = i % num_nb;
      const int64_t nb1 = std::min(num_nb, nb0 + (e - i));
      // Once per nr-block (first M chunk), just before the kernel reads the same bytes.
      if (mc == 0)
        check_rhs_packed_values(op, rhs_name, a.rhs_packed, a.n, a.k, a.nr, a.bl, nb0, nb1);
      kai::matmul(isa, a, mc * 64, std::min(a.m, mc * 64 + 64), nb0, nb1);
      i += nb1 - nb0;
    }
  });
}

// per_block: the qsi4c32p layout with block length bl (else per-channel; bl is then 0).
at::Tensor matmul_impl(const char* op, const at::Tensor& lhs_packed, const at::Tensor& rhs_packed,
                       int64_t m, int64_t n, int64_t k, bool per_block, int64_t bl, int64_t mr,
                       int64_t nr, int64_t kr, int64_t sr, std::optional<double> clamp_min,
                       std::optional<double> clamp_max, std::optional<at::ScalarType> out_dtype,
                       c10::string_view isa, const char* rhs_name = "rhs_packed",
                       bool check_lhs = true) {
  check_kai_matmul_args(op, lhs_packed, rhs_packed, m, n, k, per_block, bl, mr, nr, kr, sr,
                        clamp_min, clamp_max, out_dtype, c10::DeviceType::CPU);
  const at::ScalarType dt = out_dtype.value_or(at::kFloat);
  const Isa path = resolve_kleidiai_isa(op, isa);
  at::Tensor out = at::empty({m, n}, lhs_packed.options().dtype(at::kFloat));
  if (m == 0) return out.to(dt);
  if (check_lhs) check_lhs_packed_values(op, "lhs_packed", lhs_packed.data_ptr<uint8_t>(), m, k, mr);
  kai::MatmulArgs a{};
  a.m = m; a.n = n; a.k = k; a.mr = mr; a.nr = nr; a.kr = kr; a.sr = sr; a.bl = bl;
  a.lhs_packed = lhs_packed.data_ptr<uint8_t>();
  a.rhs_packed = rhs_packed.data_ptr<uint8_t>();
  a.dst = out.data_ptr<float>();
  a.dst_stride = n;
  a.clamp_min = clamp_min ? float(*clamp_min) : -FLT_MAX;
  a.clamp_max = clamp_max ? float(*clamp_max) : FLT_MAX;
  run_matmul(op, rhs_name, path, a);
  return dt == at::kFloat ? out : out.to(dt);
}

at::Tensor matmul_qsi4cxp(const at::Tensor& lhs_packed, const at::Tensor& rhs_packed, int64_t m,
                          int64_t n, int64_t k, int64_t mr, int64_t nr, int64_t kr, int64_t sr,
                          std::optional<double> clamp_min, std::optional<double> clamp_max,
                          std::optional<at::ScalarType> out_dtype, c10::string_view isa) {
  return matmul_impl("matmul_clamp_f32_qai8dxp_qsi4cxp", lhs_packed, rhs_packed, m, n, k, false, 0,
                     mr, nr, kr, sr, clamp_min, clamp_max, out_dtype, isa);
}

at::Tensor matmul_qsi4c32p(const at::Tensor& lhs_packed, const at::Tensor& rhs_packed, int64_t m,
                           int64_t n, int64_t k, int64_t bl, int64_t mr, int64_t nr, int64_t kr,
                           int64_t sr, std::optional<double> clamp_min,
                           std::optional<double> clamp_max,
                           std::optional<at::ScalarType> out_dtype, c10::string_view isa) {
  return matmul_impl("matmul_clamp_f32_qai8dxp_qsi4c32p", lhs_packed, rhs_packed, m, n, k, true, bl,
                     mr, nr, kr, sr, clamp_min, clamp_max, out_dtype, isa);
}

// ---- drop-in for torch.ops.aten._dyn_quant_pack_4bit_weight / _dyn_quant_matmul_4bit ----------
// Same inputs as PyTorch's ops; the packed buffer is the one PyTorch's KleidiAI path builds
// (nr=8, kr=16, sr=2; per-channel qsi4cxp with zero point 8 when block_size == in_features,
// else per-block qsi4c32p with bf16 scales).

constexpr int64_t kNr = kDynNr, kKr = kDynKr, kSr = kDynSr;

at::Tensor dyn_quant_pack_4bit_weight(const at::Tensor& weights, const at::Tensor& scales_zeros,
                                      const std::optional<at::Tensor>& bias, int64_t block_size,
                                      int64_t in_features, int64_t out_features) {
  const char* op = "dyn_quant_pack_4bit_weight";
  const int64_t k = in_features, n = out_features;
  check_dyn_quant_pack_args(weights, scales_zeros, bias, block_size, in_features, out_features,
                            c10::DeviceType::CPU);
  if (bias) check_finite_values(op, "bias", *bias);
  if (block_size == k) {
    const at::Tensor s = scales_zeros.reshape({n}).to(at::kFloat).contiguous();  // bf16 -> f32 is exact
    check_finite_values(op, "scales_zeros", s);
    return pack_qsi4cxp(op, false, weights, s, bias, n, k, kNr, kKr, kSr, 8);
  }
  check_finite_values(op, "scales_zeros", scales_zeros.contiguous());
  return pack_qsi4c32p(op, false, weights, scales_zeros.contiguous(), bias, n, k, block_size,
                       kNr, kKr, kSr);
}

at::Tensor dyn_quant_matmul_4bit(const at::Tensor& inp, const at::Tensor& packed_weights,
                                 int64_t block_size, int64_t in_features, int64_t out_features,
                                 c10::string_view isa) {
  const char* op = "dyn_quant_matmul_4bit";
  const int64_t k = in_features, n = out_features;
  check_dyn_quant_matmul_args(inp, packed_weights, block_size, in_features, out_features,
                              c10::DeviceType::CPU);
  const bool per_block = block_size != k;
  const at::Tensor x = inp.reshape({-1, k}).to(at::kFloat).contiguous();
  const int64_t m = x.size(0);
  at::Tensor lhs_packed = at::empty({kai::lhs_packed_size_qai8dxp(m, k, 1)}, x.options().dtype(at::kByte));
  quant_pack_lhs_into(op, "inp", x, 1, kKr, kSr, lhs_packed.data_ptr<uint8_t>());
  at::Tensor out = matmul_impl(op, lhs_packed, packed_weights.contiguous(), m, n, k, per_block,
                               per_block ? block_size : 0, 1, kNr, kKr, kSr, std::nullopt,
                               std::nullopt, inp.scalar_type(), isa, "packed_weights",
                               /*check_lhs=*/false);
  std::vector<int64_t> shape(inp.sizes().begin(), inp.sizes().end());
  shape.back() = n;
  return out.view(shape);
}

std::string kleidiai_isa(c10::string_view isa) {
  return kai::isa_name(resolve_kleidiai_isa("kleidiai_isa", isa));
}

}  // namespace

TORCH_LIBRARY_IMPL(w4kernels, CPU, m) {
  m.impl("rhs_pack_nxk_qsi4cxp_qs4cxs1s0", &rhs_pack_nxk_qsi4cxp);
  m.impl("rhs_pack_kxn_qsi4cxp_qs4cxs1s0", &rhs_pack_kxn_qsi4cxp);
  m.impl("rhs_pack_nxk_qsi4c32p_qsu4c32s1s0", &rhs_pack_nxk_qsi4c32p);
  m.impl("rhs_pack_kxn_qsi4c32p_qsu4c32s1s0", &rhs_pack_kxn_qsi4c32p);
  m.impl("lhs_quant_pack_qai8dxp_f32", &lhs_quant_pack_qai8dxp_f32);
  m.impl("matmul_clamp_f32_qai8dxp_qsi4cxp", &matmul_qsi4cxp);
  m.impl("matmul_clamp_f32_qai8dxp_qsi4c32p", &matmul_qsi4c32p);
  m.impl("dyn_quant_pack_4bit_weight", &dyn_quant_pack_4bit_weight);
  m.impl("dyn_quant_matmul_4bit", &dyn_quant_matmul_4bit);
}

// Size queries and the ISA query take no tensors, so they are registered for every backend
// (and run as is under FakeTensorMode).
TORCH_LIBRARY_IMPL(w4kernels, CompositeExplicitAutograd, m) {
  m.impl("rhs_packed_size_qsi4cxp", &rhs_packed_size_qsi4cxp);
  m.impl("rhs_packed_size_qsi4c32p", &rhs_packed_size_qsi4c32p);
  m.impl("lhs_packed_size_qai8dxp", &lhs_packed_size_qai8dxp);
  m.impl("kleidiai_isa", &kleidiai_isa);
}

}  // namespace w4k
