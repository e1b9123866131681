// Argument checks of the KleidiAI-format ops, shared by the CPU binding (cpu/kleidiai_ops.cpp)
// and the Meta kernels (meta.cpp), so a fake tensor is rejected with the kernel's own message.
// `device` is the device type the caller serves (CPU for the kernels; the first tensor's for a
// Meta kernel). Layouts and size formulas: kleidiai.h.
//
// What no check can catch: the packed formats carry no header (they stay byte-identical with
// KleidiAI), so a buffer packed under other parameters whose byte count happens to be the same
// is indistinguishable by size. The matmuls reject what the buffer's values betray (non-finite
// per-channel scales where every packer writes finite ones, see check_rhs_packed_scales); the
// rest is the caller's contract, stated in the Python docstrings.
#pragma once

#include <c10/core/ScalarType.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "checks.h"
#include "kleidiai.h"

namespace w4k {

// nr / kr / sr (and bl) combinations the KleidiAI packers accept and whose layout is defined:
// kr % sr == 0 (KleidiAI's assertion) and a segment of B = kr / sr bytes must tile the 16-byte
// k / k+16 pairing, so B divides 16. The per-block packers also assert nr % 4 == 0,
// bl % 32 == 0 and bl % kr == 0; we also need K % bl == 0 (no partial K block).
inline void check_nr_kr_sr(const char* op, int64_t nr, int64_t kr, int64_t sr) {
  TORCH_CHECK(nr >= 1 && nr <= 256, op, ": nr must be in [1, 256], got ", nr);
  TORCH_CHECK(kr >= 1 && sr >= 1, op, ": kr and sr must be positive, got kr=", kr, ", sr=", sr);
  TORCH_CHECK(kr <= 256, op, ": kr must be <= 256 (a micro-kernel's k step), got ", kr);
  TORCH_CHECK(kr % sr == 0, op, ": kr must be a multiple of sr (KleidiAI asserts kr % sr == 0), got kr=",
              kr, ", sr=", sr);
  TORCH_CHECK(16 % (kr / sr) == 0, op, ": kr / sr (bytes per segment) must divide 16, got kr=", kr,
              ", sr=", sr, " (kr / sr = ", kr / sr, ")");
}

inline void check_block(const char* op, int64_t k, int64_t nr, int64_t kr, int64_t bl) {
  TORCH_CHECK(nr % 4 == 0, op, ": nr must be a multiple of 4 for per-block (qsi4c32p) packing, got ", nr);
  TORCH_CHECK(bl > 0 && bl % 32 == 0, op, ": bl must be a positive multiple of 32, got ", bl);
  TORCH_CHECK(bl % kr == 0, op, ": bl must be a multiple of kr, got bl=", bl, ", kr=", kr);
  TORCH_CHECK(k % bl == 0, op, ": k must be a multiple of bl, got k=", k, ", bl=", bl);
}

inline void check_kai_sizes(const char* op, int64_t n, int64_t k, const char* n_name = "n",
                            const char* k_name = "k") {
  check_positive(op, n_name, n);
  check_positive(op, k_name, k);
  check_dim_bound(op, n_name, n);
  check_dim_bound(op, k_name, k);
}

// mr (LHS rows interleaved per block) is a micro-kernel tile height: KleidiAI's kernels use 1..16.
constexpr int64_t kMaxMr = 256;
inline void check_m_mr(const char* op, int64_t m, int64_t mr) {
  TORCH_CHECK(m >= 0, op, ": m must be >= 0, got ", m);
  check_dim_bound(op, "m", m);
  check_positive(op, "mr", mr);
  check_dim_bound(op, "mr", mr, kMaxMr);
}

inline void check_kai_input(const char* op, const char* name, const at::Tensor& t,
                            c10::ScalarType dtype, std::initializer_list<c10::SymInt> shape,
                            c10::DeviceType device) {
  check_device(op, name, t, device);
  check_dtype(op, name, t, dtype);
  check_shape(op, name, t, shape);
  check_contiguous(op, name, t);
}

// The packed formats carry no NaN or infinity: a non-finite scale or bias has no meaning, and
// refusing them at packing time lets the matmuls recognise a buffer that is not one (below).
// Reads the data: host tensors only. float32 or bfloat16, contiguous (checked before).
inline void check_finite_values(const char* op, const char* name, const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::CPU) return;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = t.scalar_type() == at::kBFloat16 ? float(t.data_ptr<at::BFloat16>()[i])
                                                     : t.data_ptr<float>()[i];
    TORCH_CHECK(std::isfinite(v), op, ": ", name, " must hold finite values (a packed buffer "
                "carries no NaN or infinity), got ", name, ".flatten()[", i, "] = ", v);
  }
}

// ---- packers --------------------------------------------------------------------------------

inline void check_rhs_pack_qsi4cxp_args(const char* op, bool kxn, const at::Tensor& rhs,
                                        const at::Tensor& scale,
                                        const std::optional<at::Tensor>& bias, int64_t n,
                                        int64_t k, int64_t nr, int64_t kr, int64_t sr,
                                        int64_t rhs_zero_point, c10::DeviceType device) {
  check_kai_sizes(op, n, k);
  check_nr_kr_sr(op, nr, kr, sr);
  TORCH_CHECK(rhs_zero_point == 0 || rhs_zero_point == 8, op,
              ": rhs_zero_point must be 8 (unsigned nibbles) or 0 (signed int4), got ", rhs_zero_point);
  if (kxn) check_kai_input(op, "rhs", rhs, at::kByte, {k, (n + 1) / 2}, device);
  else check_kai_input(op, "rhs", rhs, at::kByte, {n, (k + 1) / 2}, device);
  check_kai_input(op, "scale", scale, at::kFloat, {n}, device);
  if (bias) check_kai_input(op, "bias", *bias, at::kFloat, {n}, device);
  check_finite_values(op, "scale", scale);
  if (bias) check_finite_values(op, "bias", *bias);
}

inline void check_rhs_pack_qsi4c32p_args(const char* op, bool kxn, const at::Tensor& rhs,
                                         const at::Tensor& scale,
                                         const std::optional<at::Tensor>& bias, int64_t n,
                                         int64_t k, int64_t bl, int64_t nr, int64_t kr, int64_t sr,
                                         c10::DeviceType device) {
  check_kai_sizes(op, n, k);
  check_nr_kr_sr(op, nr, kr, sr);
  check_block(op, k, nr, kr, bl);
  if (kxn) check_kai_input(op, "rhs", rhs, at::kByte, {k, (n + 1) / 2}, device);
  else check_kai_input(op, "rhs", rhs, at::kByte, {n, k / 2}, device);
  check_kai_input(op, "scale", scale, at::kBFloat16, {n, k / bl}, device);
  if (bias) check_kai_input(op, "bias", *bias, at::kFloat, {n}, device);
  check_finite_values(op, "scale", scale);
  if (bias) check_finite_values(op, "bias", *bias);
}

inline void check_lhs_quant_pack_args(const at::Tensor& lhs, int64_t mr, int64_t kr, int64_t sr,
                                      c10::DeviceType device) {
  const char* op = "lhs_quant_pack_qai8dxp_f32";
  check_device(op, "lhs", lhs, device);
  check_dtype(op, "lhs", lhs, at::kFloat);
  check_dim(op, "lhs", lhs, 2);
  check_positive(op, "k (lhs.size(1))", lhs.sym_size(1));
  check_dim_bound(op, "k (lhs.size(1))", lhs.sym_size(1));
  check_positive(op, "mr", mr);
  check_dim_bound(op, "mr", mr, kMaxMr);
  check_nr_kr_sr(op, 1, kr, sr);
  TORCH_CHECK(lhs.sym_stride(1) == 1, op, ": lhs must have unit stride along K, got strides ",
              lhs.sym_strides());
}

// Per-row asymmetric int8 quantization of a NaN or an infinity has no meaning (the row's scale
// becomes 0 or NaN and every code is garbage), so the quantizing ops reject them. Reads the
// data: host tensors only (a Meta kernel has none).
// Rows [r0, r1) (all by default); the quantizers call it per task, just before packing the
// same rows.
inline void check_finite_rows(const char* op, const char* name, const at::Tensor& x2d,
                              int64_t r0 = 0, int64_t r1 = -1) {
  if (x2d.device().type() != c10::DeviceType::CPU) return;
  const float* p = x2d.data_ptr<float>();
  const int64_t k = x2d.size(1), ld = x2d.stride(0);
  if (r1 < 0) r1 = x2d.size(0);
  for (int64_t r = r0; r < r1; ++r) {
    // Exponent bits all ones <=> NaN or +-Inf; integer ops, so the scan vectorizes.
    uint32_t non_finite = 0;
    for (int64_t c = 0; c < k; ++c) {
      uint32_t u;
      std::memcpy(&u, p + r * ld + c, 4);
      non_finite |= uint32_t((u & 0x7f800000u) == 0x7f800000u);
    }
    if (non_finite == 0) continue;
    for (int64_t c = 0; c < k; ++c)
      TORCH_CHECK(std::isfinite(p[r * ld + c]), op, ": ", name, " must hold finite values (per-row "
                  "int8 quantization has no NaN or infinity), got ", name, "[", r, ", ", c,
                  "] = ", p[r * ld + c]);
  }
}

// ---- matmuls --------------------------------------------------------------------------------

// "auto" -> env W4K_KLEIDIAI_ISA, else the best; a name this CPU cannot run is an error that
// names the value actually rejected (the environment's, for "auto").
inline kai::Isa resolve_kleidiai_isa(const char* op, c10::string_view isa) {
  kai::Isa out;
  const char* why = "";
  const std::string name(isa);
  if (kai::parse_isa(name.c_str(), &out, &why)) return out;
  const char* env = std::getenv("W4K_KLEIDIAI_ISA");
  if (name == "auto" && env != nullptr && *env != '\0') {
    TORCH_CHECK(false, op, ": W4K_KLEIDIAI_ISA='", env, "' (the environment, read for isa='auto')",
                " cannot be used: ", why);
  }
  TORCH_CHECK(false, op, ": isa '", name, "' cannot be used: ", why);
  return out;
}

// Everything of a matmul that is not a tensor: sizes, packing parameters, clamp bounds, dtype.
// per_block: the qsi4c32p op, whose bl must be a legal block length (bl <= 0 must not fall back
// to the per-channel layout).
inline void check_kai_matmul_params(const char* op, int64_t m, int64_t n, int64_t k,
                                    bool per_block, int64_t bl,
                                    int64_t mr, int64_t nr, int64_t kr, int64_t sr,
                                    std::optional<double> clamp_min,
                                    std::optional<double> clamp_max,
                                    std::optional<c10::ScalarType> out_dtype) {
  check_m_mr(op, m, mr);
  check_kai_sizes(op, n, k);
  // int32 accumulation, as KleidiAI's: |16 * dot| <= 16 * 128 * 8 * K_i must stay below 2^31.
  TORCH_CHECK(k <= 131072, op, ": k must be <= 131072 (int32 accumulators), got ", k);
  check_nr_kr_sr(op, nr, kr, sr);
  if (per_block) check_block(op, k, nr, kr, bl);
  // NaN bounds: IEEE min/max would drop them, the kernels' compare-and-select would not, and no
  // caller means "clamp to NaN": rejected, as the reference does.
  TORCH_CHECK(!(clamp_min && std::isnan(*clamp_min)), op, ": clamp_min must not be NaN");
  TORCH_CHECK(!(clamp_max && std::isnan(*clamp_max)), op, ": clamp_max must not be NaN");
  const c10::ScalarType dt = out_dtype.value_or(at::kFloat);
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, op,
              ": out_dtype must be float32 or bfloat16, got ", dt);
}

inline void check_kai_matmul_args(const char* op, const at::Tensor& lhs_packed,
                                  const at::Tensor& rhs_packed, int64_t m, int64_t n, int64_t k,
                                  bool per_block, int64_t bl, int64_t mr, int64_t nr, int64_t kr, int64_t sr,
                                  std::optional<double> clamp_min,
                                  std::optional<double> clamp_max,
                                  std::optional<c10::ScalarType> out_dtype,
                                  c10::DeviceType device) {
  check_kai_matmul_params(op, m, n, k, per_block, bl, mr, nr, kr, sr, clamp_min, clamp_max,
                          out_dtype);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor&>{"lhs_packed", lhs_packed},
                         {"rhs_packed", rhs_packed}}) {
    check_device(op, name, t, device);
    check_dtype(op, name, t, at::kByte);
    check_contiguous(op, name, t);
  }
  const int64_t lhs_size = kai::lhs_packed_size_qai8dxp(m, k, mr);
  const int64_t rhs_size = per_block ? kai::rhs_packed_size_qsi4c32p(n, k, nr, bl)
                                  : kai::rhs_packed_size_qsi4cxp(n, k, nr);
  TORCH_CHECK(lhs_packed.sym_numel() == lhs_size, op, ": lhs_packed must hold ", lhs_size,
              " bytes (lhs_packed_size_qai8dxp(m=", m, ", k=", k, ", mr=", mr, ")), got ",
              lhs_packed.sym_numel());
  TORCH_CHECK(rhs_packed.sym_numel() == rhs_size, op, ": rhs_packed must hold ", rhs_size,
              " bytes for n=", n, ", k=", k, ", nr=", nr, per_block ? ", bl=" : "",
              per_block ? std::to_string(bl) : std::string(), ", got ", rhs_packed.sym_numel());
}

// ---- values every packer writes ------------------------------------------------------------
// The formats have no header, so a buffer packed under other parameters with the same byte count
// passes the size checks: a per-channel RHS of n = 24, k = 128 and a per-block one with bl = 64
// are both 1824 bytes; an LHS packed with mr = 4 has the size of one with mr = 1 whenever
// m % 4 == 0. Read under the wrong parameters, the per-row metadata slots land on other data,
// which almost never looks like what a packer writes there:
//   LHS, each row < m:     -zero_point in [-127, 128] (the zero point is clamped to int8) and
//                          1/scale finite and > 0 (scale = 255 / (rmax - rmin), or 1).
//   per-channel RHS, n:    rsum = 16 * sum of K_i int4 weights: a multiple of 16 in
//                          [-128 K_i, 112 K_i]; scale and bias finite.
//   per-block RHS, n:      the bf16 scales of the first and the last K block, rsum and bias
//                          finite.
// Each reads O(m) or O(n) values, nothing per weight (the RHS check runs per nr-block just
// before the kernel reads the same block). A per-channel and a per-block layout (same nr) have
// the same size only when k = 2 bl, i.e. two K blocks, so the per-block scales checked are all
// of them there; the per-block rsum of the misread buffer lands on the per-channel scales
// (finite), its last block's scales on the halves of per-channel rsums (0xffff, a NaN, for a
// negative one). What the checks cannot see, a buffer whose weights were reordered under another
// kr / sr with intact metadata, is the caller's contract (ops.py docstrings).
namespace packed {
inline int32_t load_i32(const uint8_t* p) { int32_t v; std::memcpy(&v, p, 4); return v; }
inline float load_f32(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }
inline float load_bf16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t u = uint32_t(h) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
}  // namespace packed

inline void check_lhs_packed_values(const char* op, const char* name, const uint8_t* buf,
                                    int64_t m, int64_t k, int64_t mr) {
  const int64_t k_i = kai::k_internal(k), stride = kai::lhs_packed_stride_qai8dxp(k, mr);
  for (int64_t r = 0; r < m; ++r) {
    const uint8_t* params = buf + (r / mr) * stride + mr * k_i;
    const int32_t neg_zp = packed::load_i32(params + 4 * (r % mr));
    const float recip = packed::load_f32(params + 4 * mr + 4 * (r % mr));
    TORCH_CHECK(neg_zp >= -127 && neg_zp <= 128 && std::isfinite(recip) && recip > 0.f, op, ": ",
                name, " is not a buffer packed for m=", m, ", k=", k, ", mr=", mr, ": row ", r,
                " holds -zero_point ", neg_zp, " and 1/scale ", recip, " where the packer writes "
                "one in [-127, 128] and a positive finite one (packed with another mr of the same "
                "byte count?)");
  }
}

// nr-blocks [nb0, nb1) of a packed RHS (bl = 0: per-channel qsi4cxp, else per-block qsi4c32p).
inline void check_rhs_packed_values(const char* op, const char* name, const uint8_t* buf,
                                    int64_t n, int64_t k, int64_t nr, int64_t bl, int64_t nb0,
                                    int64_t nb1) {
  const char* what = bl > 0 ? "per-block qsi4c32p" : "per-channel qsi4cxp";
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    for (int64_t r = 0; r < nr && nb * nr + r < n; ++r) {
      const int64_t row = nb * nr + r;
      if (bl == 0) {
        const int64_t k_i = kai::k_internal(k);
        const uint8_t* meta = buf + nb * kai::rhs_packed_stride_qsi4cxp(k, nr) + nr * k_i / 2;
        const int32_t rsum = packed::load_i32(meta + 4 * r);
        const float scale = packed::load_f32(meta + 4 * nr + 4 * r);
        const float bias = packed::load_f32(meta + 8 * nr + 4 * r);
        TORCH_CHECK(rsum % 16 == 0 && rsum >= -128 * k_i && rsum <= 112 * k_i &&
                        std::isfinite(scale) && std::isfinite(bias),
                    op, ": ", name, " is not a ", what, " buffer packed for n=", n, ", k=", k,
                    ", nr=", nr, ": row ", row, " holds rsum ", rsum, ", scale ", scale,
                    ", bias ", bias, " where the packer writes 16 * a sum of ", k_i,
                    " int4 weights and finite values (packed with other parameters of the same "
                    "byte count?)");
      } else {
        const int64_t blocks = k / bl, block_bytes = nr * (bl / 2 + 2);
        const uint8_t* base = buf + nb * kai::rhs_packed_stride_qsi4c32p(k, nr, bl);
        for (int64_t j : {int64_t{0}, blocks - 1}) {
          const float s = packed::load_bf16(base + j * block_bytes + nr * bl / 2 + 2 * r);
          TORCH_CHECK(std::isfinite(s), op, ": ", name, " is not a ", what,
                      " buffer packed for n=", n, ", k=", k, ", bl=", bl, ", nr=", nr, ": row ",
                      row, " holds the non-finite block scale ", s, " in block ", j,
                      " (packed with other parameters of the same byte count?)");
        }
        const float rsum = packed::load_f32(base + blocks * block_bytes + 4 * r);
        const float bias = packed::load_f32(base + blocks * block_bytes + 4 * nr + 4 * r);
        TORCH_CHECK(std::isfinite(rsum) && std::isfinite(bias), op, ": ", name, " is not a ",
                    what, " buffer packed for n=", n, ", k=", k, ", bl=", bl, ", nr=", nr,
                    ": row ", row, " holds rsum ", rsum, " and bias ", bias, " where the packer "
                    "writes finite values (packed with other parameters of the same byte count?)");
      }
    }
  }
}

// ---- drop-in for torch.ops.aten._dyn_quant_pack_4bit_weight / _dyn_quant_matmul_4bit --------
// The packed buffer is the one PyTorch's KleidiAI path builds: nr=8, kr=16, sr=2.
constexpr int64_t kDynNr = 8, kDynKr = 16, kDynSr = 2;

inline void check_block_size(const char* op, int64_t block_size, int64_t in_features) {
  TORCH_CHECK(block_size == in_features || (block_size > 0 && block_size % 32 == 0 &&
                                            in_features % block_size == 0),
              op, ": block_size must equal in_features (per-channel) or be a multiple of 32 that "
              "divides in_features, got block_size=", block_size, ", in_features=", in_features);
}

inline void check_dyn_quant_pack_args(const at::Tensor& weights, const at::Tensor& scales_zeros,
                                      const std::optional<at::Tensor>& bias, int64_t block_size,
                                      int64_t in_features, int64_t out_features,
                                      c10::DeviceType device) {
  const char* op = "dyn_quant_pack_4bit_weight";
  const int64_t k = in_features, n = out_features;
  check_kai_sizes(op, n, k, "out_features", "in_features");
  check_block_size(op, block_size, k);
  check_multiple(op, "in_features", k, 2);
  check_kai_input(op, "weights", weights, at::kByte, {n, k / 2}, device);
  check_same_device(op, "scales_zeros", scales_zeros, "weights", weights);
  if (block_size == k) {
    TORCH_CHECK(scales_zeros.scalar_type() == at::kFloat || scales_zeros.scalar_type() == at::kBFloat16,
                op, ": scales_zeros must have dtype float32 or bfloat16 for per-channel weights, got ",
                scales_zeros.scalar_type());
    TORCH_CHECK(scales_zeros.sym_numel() == n && (scales_zeros.dim() == 1 || scales_zeros.dim() == 2),
                op, ": scales_zeros must have shape [", n, "] or [", n, ", 1], got ",
                scales_zeros.sym_sizes());
  } else {
    // Per-block: bf16 scales, as PyTorch's KleidiAI path requires (an f32 scale would have to
    // be rounded, silently changing the result).
    check_dtype(op, "scales_zeros", scales_zeros, at::kBFloat16);
    check_shape(op, "scales_zeros", scales_zeros, {n, k / block_size});
  }
  if (bias) check_kai_input(op, "bias", *bias, at::kFloat, {n}, device);
}

inline void check_dyn_quant_matmul_args(const at::Tensor& inp, const at::Tensor& packed_weights,
                                        int64_t block_size, int64_t in_features,
                                        int64_t out_features, c10::DeviceType device) {
  const char* op = "dyn_quant_matmul_4bit";
  const int64_t k = in_features, n = out_features;
  check_kai_sizes(op, n, k, "out_features", "in_features");
  // The internal matmul's int32 accumulators (check_kai_matmul_params), named as the caller's.
  TORCH_CHECK(k <= 131072, op, ": in_features must be <= 131072 (int32 accumulators), got ", k);
  check_block_size(op, block_size, k);
  check_device(op, "inp", inp, device);
  TORCH_CHECK(inp.scalar_type() == at::kFloat || inp.scalar_type() == at::kBFloat16, op,
              ": inp must have dtype float32 or bfloat16, got ", inp.scalar_type());
  TORCH_CHECK(inp.dim() >= 1 && inp.sym_size(-1) == k, op,
              ": inp must have shape [..., in_features=", k, "], got ", inp.sym_sizes());
  check_device(op, "packed_weights", packed_weights, device);
  const bool per_block = block_size != k;
  const int64_t expected = per_block ? kai::rhs_packed_size_qsi4c32p(n, k, kDynNr, block_size)
                                     : kai::rhs_packed_size_qsi4cxp(n, k, kDynNr);
  TORCH_CHECK(packed_weights.scalar_type() == at::kByte && packed_weights.sym_numel() == expected,
              op, ": packed_weights must be the uint8 buffer of dyn_quant_pack_4bit_weight (",
              expected, " bytes for in_features=", k, ", out_features=", n, ", block_size=",
              block_size, "), got dtype ", packed_weights.scalar_type(), " with ",
              packed_weights.sym_numel(), " elements");
  // The internal matmul's remaining limits, reported under this op's name.
  check_kai_matmul_params(op, 0, n, k, per_block, per_block ? block_size : 0, 1, kDynNr, kDynKr, kDynSr,
                          std::nullopt, std::nullopt, inp.scalar_type());
}

}  // namespace w4k
