// Every operator of w4kernels, declared once.
//
// `define_ops` is called by TORCH_LIBRARY(w4kernels, m) in ops.cpp (the product) and by
// TORCH_LIBRARY(w4kernels_simt, m) in simt/ops_simt.cpp (the CUDA kernels run on CPU tensors
// under the SIMT emulator), so both namespaces carry identical schemas.
//
// Signatures follow vLLM's where an equivalent exists, so model code can swap us in. Arguments
// a kernel may write are declared with (a!). Implementations register per dispatch key:
//   CPU  -> csrc/cpu/<op>.cpp     CUDA -> csrc/cuda/<op>.cu     fakes -> python/w4kernels/ops.py
#pragma once

#include <torch/library.h>

namespace w4k {

inline void define_ops(torch::Library& m) {
  // ---- Marlin ---------------------------------------------------------------------------
  // GPTQ-packed int32 [K/8, N] (optional act-order perm int32 [K]; None or empty = no
  // act-order) -> Marlin layout int32 [K/16, 2N]. Byte-identical to vLLM gptq_marlin_repack.
  m.def("marlin_repack(Tensor b_q_weight, Tensor? perm, SymInt size_k, SymInt size_n, "
        "int num_bits) -> Tensor");
  // AWQ-packed int32 [K, N/8] -> Marlin layout int32 [K/16, 2N]. Byte-identical to vLLM
  // awq_marlin_repack.
  m.def("awq_marlin_repack(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits) "
        "-> Tensor");
  // fp16/bf16 activations [M, K] x Marlin int4 weight -> [M, N]; vLLM gptq_marlin_gemm
  // semantics. workspace is the GPU kernel's inter-block lock array (zeroed on entry and exit).
  m.def("w4a16_gemm(Tensor a, Tensor b_q_weight, Tensor b_scales, Tensor? b_zeros, "
        "Tensor? g_idx, Tensor? perm, Tensor(a!) workspace, int num_bits, SymInt size_m, "
        "SymInt size_n, SymInt size_k, bool is_k_full, Tensor? b_bias=None, "
        "bool use_fp32_reduce=True) -> Tensor");

  // ---- AWQ ------------------------------------------------------------------------------
  // vLLM awq_dequantize: (q - z) * s as [K, N] in the scales' dtype. split_k_iters, thx and
  // thy are accepted for signature compatibility (0 = choose automatically).
  m.def("awq_dequantize(Tensor qweight, Tensor scales, Tensor qzeros, SymInt split_k_iters, "
        "int thx, int thy) -> Tensor");
  // vLLM awq_gemm: x [M, K] @ dequantized weight [K, N] -> [M, N] in x's dtype.
  m.def("awq_gemm(Tensor x, Tensor qweight, Tensor scales, Tensor qzeros, "
        "SymInt split_k_iters) -> Tensor");

  // ---- KleidiAI -------------------------------------------------------------------------
  // (pack_rhs family, lhs_quant_pack_qai8dxp and the matmul that consumes them)
}

}  // namespace w4k
