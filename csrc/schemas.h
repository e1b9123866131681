// Every operator of w4kernels, declared once.
//
// `define_ops` is called by TORCH_LIBRARY(w4kernels, m) in ops.cpp (the product) and by
// TORCH_LIBRARY(w4kernels_simt, m) in simt/ops_simt.cpp (the CUDA kernels run on CPU tensors
// under the SIMT emulator), so both namespaces carry identical schemas.
//
// Signatures follow vLLM's where an equivalent exists, so model code can swap us in. Arguments
// a kernel may write are declared with (a!). Implementations register per dispatch key:
//   CPU  -> csrc/cpu/<op>.cpp     CUDA -> csrc/cuda/<op>.cu     Meta (the fakes) -> csrc/meta.cpp
#pragma once

#include <torch/library.h>

namespace w4k {

inline void define_ops(torch::Library& m) {
  // ---- Marlin ---------------------------------------------------------------------------
  // GPTQ-packed int32 [K/8, N] (optional act-order perm int32 [K]; None or empty = no
  // act-order) -> Marlin layout int32 [K/16, 2N]. Byte-identical to vLLM gptq_marlin_repack.
  m.def("marlin_repack(Tensor b_q_weight, Tensor? perm, SymInt size_k, SymInt size_n, "
        "int num_bits=4) -> Tensor");
  // AWQ-packed int32 [K, N/8] -> Marlin layout int32 [K/16, 2N]. Byte-identical to vLLM
  // awq_marlin_repack.
  m.def("awq_marlin_repack(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits=4) "
        "-> Tensor");
  // fp16/bf16 activations [M, K] x Marlin int4 weight -> [M, N]; vLLM gptq_marlin_gemm
  // semantics. workspace holds the GPU kernel's split-K arrival counters (zero on entry and exit).
  m.def("w4a16_gemm(Tensor a, Tensor b_q_weight, Tensor b_scales, Tensor? b_zeros, "
        "Tensor? g_idx, Tensor? perm, Tensor(a!) workspace, int num_bits, SymInt size_m, "
        "SymInt size_n, SymInt size_k, bool is_k_full=True, Tensor? b_bias=None, "
        "bool use_fp32_reduce=True) -> Tensor");

  // ---- AWQ ------------------------------------------------------------------------------
  // vLLM awq_dequantize: (q - z) * s as [K, N] in the scales' dtype. split_k_iters, thx and
  // thy are accepted for signature compatibility (0 = choose automatically).
  m.def("awq_dequantize(Tensor qweight, Tensor scales, Tensor qzeros, SymInt split_k_iters=0, "
        "int thx=0, int thy=0) -> Tensor");
  // vLLM awq_gemm: x [M, K] @ dequantized weight [K, N] -> [M, N] in x's dtype.
  m.def("awq_gemm(Tensor x, Tensor qweight, Tensor scales, Tensor qzeros, "
        "SymInt split_k_iters=8) -> Tensor");

  // ---- KleidiAI -------------------------------------------------------------------------
  // Names follow KleidiAI's (layouts in csrc/kleidiai.h and w4kernels.reference). RHS packers:
  // uint8 source (nxk [n, ceil(k/2)] / kxn [k, ceil(n/2)], low nibble = lower index) ->
  // uint8 [rhs_packed_size_*] bytes, byte-identical to KleidiAI's scalar packers.
  m.def("rhs_pack_nxk_qsi4cxp_qs4cxs1s0(Tensor rhs, Tensor scale, Tensor? bias, int n, int k, "
        "int nr=8, int kr=16, int sr=2, int rhs_zero_point=8) -> Tensor");
  m.def("rhs_pack_kxn_qsi4cxp_qs4cxs1s0(Tensor rhs, Tensor scale, Tensor? bias, int n, int k, "
        "int nr=8, int kr=16, int sr=2, int rhs_zero_point=8) -> Tensor");
  m.def("rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(Tensor rhs, Tensor scale, Tensor? bias, int n, int k, "
        "int bl, int nr=8, int kr=16, int sr=2) -> Tensor");
  m.def("rhs_pack_kxn_qsi4c32p_qsu4c32s1s0(Tensor rhs, Tensor scale, Tensor? bias, int n, int k, "
        "int bl, int nr=8, int kr=16, int sr=2) -> Tensor");
  // Size queries (bytes), registered for every backend (they take no tensors).
  m.def("rhs_packed_size_qsi4cxp(int n, int k, int nr=8, int kr=16, int sr=2) -> int");
  m.def("rhs_packed_size_qsi4c32p(int n, int k, int bl, int nr=8, int kr=16, int sr=2) -> int");
  m.def("lhs_packed_size_qai8dxp(int m, int k, int mr=1, int kr=16, int sr=2) -> int");
  // f32 [m, k] -> per-row asymmetric int8, mr rows interleaved: uint8 [lhs_packed_size].
  m.def("lhs_quant_pack_qai8dxp_f32(Tensor lhs, int mr=1, int kr=16, int sr=2) -> Tensor");
  // Packed LHS x packed RHS -> [m, n] f32 (or bf16), bias and clamp from KleidiAI's epilogue.
  // isa: "auto" (env W4K_KLEIDIAI_ISA, else the best), "avx512", "avxvnni", "avx2", "scalar".
  m.def("matmul_clamp_f32_qai8dxp_qsi4cxp(Tensor lhs_packed, Tensor rhs_packed, int m, int n, "
        "int k, int mr=1, int nr=8, int kr=16, int sr=2, float? clamp_min=None, "
        "float? clamp_max=None, ScalarType? out_dtype=None, str isa=\"auto\") -> Tensor");
  m.def("matmul_clamp_f32_qai8dxp_qsi4c32p(Tensor lhs_packed, Tensor rhs_packed, int m, int n, "
        "int k, int bl, int mr=1, int nr=8, int kr=16, int sr=2, float? clamp_min=None, "
        "float? clamp_max=None, ScalarType? out_dtype=None, str isa=\"auto\") -> Tensor");
  // Drop-in for torch.ops.aten._dyn_quant_pack_4bit_weight / _dyn_quant_matmul_4bit (same
  // inputs; the packed buffer is KleidiAI's nr=8, kr=16, sr=2 layout).
  m.def("dyn_quant_pack_4bit_weight(Tensor weights, Tensor scales_zeros, Tensor? bias, "
        "int block_size, int in_features, int out_features) -> Tensor");
  m.def("dyn_quant_matmul_4bit(Tensor inp, Tensor packed_weights, int block_size, "
        "int in_features, int out_features, str isa=\"auto\") -> Tensor");
  // The kernel path "auto" (or a forced name) resolves to on this CPU.
  m.def("kleidiai_isa(str isa=\"auto\") -> str");
}

// The int8-activation mode (CPU only, so not in the emulator namespace): activations quantized
// per call to int8 per block of K, int4 x int8 sums exact in int32 (vpdpbusd), fp32 scaling.
// Never the default of w4a16_gemm / awq_gemm; csrc/cpu/w4a8_gemm_kernel.h has the scheme.
inline void define_cpu_only_ops(torch::Library& m) {
  // Marlin-format tensors of w4a16_gemm (no workspace: the CPU has no split-K counters).
  m.def("w4a8_gemm(Tensor a, Tensor b_q_weight, Tensor b_scales, Tensor? b_zeros, "
        "Tensor? g_idx, Tensor? perm, int num_bits, SymInt size_m, SymInt size_n, "
        "SymInt size_k, bool is_k_full=True, Tensor? b_bias=None) -> Tensor");
  // AutoAWQ qweight / scales / qzeros as awq_gemm takes them (no split_k_iters: GPU only).
  m.def("awq_gemm_a8(Tensor x, Tensor qweight, Tensor scales, Tensor qzeros) -> Tensor");
  // How the CPU GEMMs' jobs ran so far in this process (cpu/w4a16_gemm_work_queue.h):
  // [jobs on torch's OpenMP team, jobs on our own workers, OpenMP jobs with a late thread].
  m.def("cpu_thread_stats() -> int[]");
}

}  // namespace w4k
