// CPU bindings of the int8-activation mode: w4a8_gemm (Marlin-format weights, the tensors of
// w4a16_gemm) and awq_gemm_a8 (AutoAWQ qweight / scales / qzeros, as awq_gemm). Checks
// (w4a8_checks.h), the per-call activation quantization and the work split on the w4a16 work
// queue; the kernel is torch-free: cpu/w4a8_gemm_kernel.h (scheme, portable path),
// cpu/w4a8_gemm_avx512.h and cpu/w4a8_gemm_avx2.h. CPU only: the CUDA key gets an error that
// says so.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // at::get_num_threads
#include <ATen/record_function.h>
#include <torch/library.h>

#include <vector>

#include "cpu/isa.h"
#include "cpu/w4a16_gemm_work_queue.h"
#include "cpu/w4a8_gemm_avx2.h"
#include "cpu/w4a8_gemm_avx512.h"
#include "cpu/w4a8_gemm_kernel.h"
#include "w4a8_checks.h"

namespace w4k {
namespace {

// Quantizes the activations (on the queue), then runs items of (row block, chunk group).
at::Tensor run_w4a8(cpu::W4a8Problem& p, const at::Tensor& a, const int32_t* perm,
                    const std::optional<at::Tensor>& bias) {
  const int64_t size_m = p.size_m, size_n = p.size_n, size_k = p.size_k;
  at::Tensor out = at::empty({size_m, size_n}, a.options());
  if (size_m == 0) return out;
  // AVX-512 VNNI (AWQ: + VBMI); else AVX2 (+ AVX-VNNI where the CPU has it; also AWQ on an
  // AVX-512 VNNI CPU without VBMI); else the portable loop. All give the same bits.
  const Isa isa = cpu_isa();
  const bool avx512 = isa == Isa::kAvx512 && cpu::a8_avx512_supported(p.format);
  const bool avx2 = !avx512 && isa >= Isa::kAvx2 && cpu::a8_avx2_supported();
  const bool avxvnni = avx2 && cpu::a8_avx2_use_vnni();
  const cpu::A8Simd simd = avx512 ? cpu::A8Simd::kAvx512
                           : avx2 ? cpu::A8Simd::kAvx2
                                  : cpu::A8Simd::kNone;
  const int threads = static_cast<int>(at::get_num_threads());
  p.num_blocks = size_k / p.block;
  // Row stride K + 64: K a multiple of 1024 would put the 6 rows of a tile in the same L1 sets.
  p.lda_q = size_k + 64;
  // The quantized activations: qa int8 [M, lda_q], sa fp32 [M, blocks], sumqa int32
  // [M, blocks], in one scratch buffer kept per calling thread and reused (grown when a larger
  // call comes), as w4a16_gemm's: three tensors per call were a fixed cost of every M = 1 call
  // (README "Whole-model speed"). Calls needing more than kKeptScratchBytes get a buffer of
  // their own, freed on return (a long prompt does not pin it for the thread's life).
  constexpr size_t kKeptScratchBytes = size_t{64} << 20;
  const size_t qa_words = static_cast<size_t>((size_m + cpu::kAmxPadRows) * p.lda_q + 3) / 4;
  const size_t block_words = static_cast<size_t>(size_m * p.num_blocks);
  const size_t need = qa_words + 2 * block_words + 16;  // + 16: qa starts on a 64-byte line
  thread_local std::vector<int32_t> kept_scratch;
  std::vector<int32_t> own_scratch;
  std::vector<int32_t>& scratch_buf = need * 4 <= kKeptScratchBytes ? kept_scratch : own_scratch;
  if (scratch_buf.size() < need) scratch_buf.resize(need);
  at::Tensor bias32;
  if (bias.has_value()) bias32 = bias->to(at::kFloat).contiguous();  // N elements
  int32_t* base = scratch_buf.data() + (-(reinterpret_cast<uintptr_t>(scratch_buf.data()) / 4) & 15);
  p.qa = reinterpret_cast<int8_t*>(base);
  p.sa = reinterpret_cast<float*>(base + qa_words);
  p.sumqa = base + qa_words + block_words;
  p.bias = bias32.defined() ? bias32.data_ptr<float>() : nullptr;
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());

  const uint16_t* a_bits = reinterpret_cast<const uint16_t*>(a.data_ptr());
  const int64_t lda = a.stride(0);
  const int64_t rows_per_prep = std::max<int64_t>(1, size_m / (4 * threads));
  cpu::WorkQueue::instance().run((size_m + rows_per_prep - 1) / rows_per_prep, threads,
                                 [&](int64_t item) {
    thread_local std::vector<float> scratch;  // K floats, per thread (not per call)
    if (static_cast<int64_t>(scratch.size()) < size_k) scratch.resize(size_k);
    const int64_t m1 = std::min(size_m, (item + 1) * rows_per_prep);
    for (int64_t m = item * rows_per_prep; m < m1; ++m)
      cpu::quantize_a8_row(p, a_bits + m * lda, perm, simd,
                           const_cast<int8_t*>(p.qa) + m * p.lda_q,
                           const_cast<float*>(p.sa) + m * p.num_blocks,
                           const_cast<int32_t*>(p.sumqa) + m * p.num_blocks, scratch.data());
  });

  // Items: (row block, group of 64-column chunks). Chunk groups are even (AWQ: a 64-byte line
  // holds 2 chunks of a row); rows are split only when there are too few chunk groups, and then
  // into blocks of >= 48 rows (each row block decodes the weights again).
  const int64_t num_chunks = size_n / 64;
  // Marlin, 1-4 rows (bandwidth-bound): about 2 items per thread, so an item reads long runs of
  // each k-tile line (N = 4096: 8 chunks = 4 KiB, one page) instead of 4 strided 512-byte runs
  // per chunk: measured 5-20 % faster at M = 1 than 4 items per thread (h-a8tune; the AVX-512
  // and AVX2 paths take one per thread, below). More rows: about 4 items per thread, for the
  // balance between the 2 threads.
  const int64_t items_per_thread = size_m <= cpu::kA8FewRows ? 2 : 4;
  int64_t chunks_per_item = std::max<int64_t>(2, num_chunks / (2 * items_per_thread * threads));
  chunks_per_item += chunks_per_item % 2;
  // AWQ: items of 8 chunks up to 16 rows, 256 contiguous bytes of each row per block (AWQ rows
  // are N/2 bytes apart: one line per row per item means a page per line, a TLB miss each at
  // N = 11008; 8 chunks: 10-15 % faster at M = 8, 16 there), decoded two pairs at a time; more
  // rows 4 (on the AMX-INT8 tiles 1.03-1.14x the speed of 2 at M = 24, level at 48-128; the
  // register tiles level).
  if (p.format == cpu::A8Format::kAwq) chunks_per_item = size_m <= cpu::kA8GroupRows ? 8 : 4;
#ifdef W4K_HAVE_A8_AVX512
  // 1-4 rows on the AVX-512 path (both formats) and the AVX2 path (Marlin): one strip of the
  // columns per thread, so that the threads read every weight row (AWQ, on the sweeps of
  // cpu/w4a8_gemm_avx512.h "whole strips") or k-tile row (Marlin) at the same time. Marlin,
  // measured 2026-12-02 (AMX Xeon VM, 2 threads, weights rotated, back-to-back loops, two
  // rounds) against the items above (8 chunks at N = 4096, 22 at 11008): AVX-512, M = 1 / 2 / 4
  // 1.09-1.15 / 1.17-1.20 / 1.16 on 11008 x 4096, 1.08-1.11 / 1.05-1.06 / 1.03-1.08 on 4096 x
  // 11008, level on 4096 x 4096 (0.371-0.377 ms against 0.377-0.460 at M = 1); AVX2
  // (W4K_CPU_ISA=avx2 on the same CPU, so with AVX-VNNI), M = 1 / 4 1.11-1.14 / 1.10-1.12 on
  // 11008 x 4096, level on 4096 x 4096.
  if ((avx512 || (avx2 && p.format == cpu::A8Format::kMarlin)) && size_m <= cpu::kA8FewRows &&
      (p.format == cpu::A8Format::kMarlin || cpu::awq_sweep_applies(p, size_m))) {
    chunks_per_item = (num_chunks + threads - 1) / threads;
    chunks_per_item += chunks_per_item % 2;
  }
#endif
  // Large M: keep an item's fp32 accumulators (rows x 64 x chunks floats) within ~256 KiB.
  while (chunks_per_item > 2 && size_m * 64 * chunks_per_item * 4 > (256 << 10))
    chunks_per_item -= 2;
  const int64_t col_items = (num_chunks + chunks_per_item - 1) / chunks_per_item;
  int64_t row_blocks = 1;
  if (col_items < 4 * threads)
    row_blocks = std::max<int64_t>(1, std::min((4 * threads + col_items - 1) / col_items,
                                               size_m / 48));
  const int64_t rows_per_block = (size_m + row_blocks - 1) / row_blocks;
  auto run_item = [&](int64_t item) {
    const int64_t rb = item / col_items, cg = item % col_items;
    const int64_t ch0 = cg * chunks_per_item, ch1 = std::min(num_chunks, ch0 + chunks_per_item);
    const int64_t m0 = rb * rows_per_block, m1 = std::min(size_m, m0 + rows_per_block);
    if (m0 >= m1) return;
#ifdef W4K_HAVE_A8_AVX512
    if (avx512) {
      cpu::w4a8_chunks_avx512(p, ch0, ch1, m0, m1);
      return;
    }
    if (avxvnni) {
      cpu::w4a8_chunks_avx2<true>(p, ch0, ch1, m0, m1);
      return;
    }
    if (avx2) {
      cpu::w4a8_chunks_avx2<false>(p, ch0, ch1, m0, m1);
      return;
    }
#endif
    cpu::w4a8_chunks_portable(p, ch0, ch1, m0, m1);
  };
  const auto run_items = [&] {
    cpu::WorkQueue::instance().run(col_items * row_blocks, threads, run_item);
  };
#ifdef W4K_HAVE_A8_AVX512
  if (avx512 && cpu::awq_pairs_apply(p)) {
    // The AWQ chunk pairs (cpu/w4a8_gemm_avx512.h) give every path's bits: these events say
    // they ran, and at 1-4 rows in sweeps (tests).
    RECORD_FUNCTION("w4kernels::awq_gemm_a8[unpack pairs]", std::vector<c10::IValue>());
    if (cpu::awq_sweep_applies(p, size_m)) {
      RECORD_FUNCTION("w4kernels::awq_gemm_a8[sweeps]", std::vector<c10::IValue>());
      run_items();
      return out;
    }
    run_items();
    return out;
  }
#endif
  run_items();
  return out;
}

cpu::HalfType half_type(const at::Tensor& a) {
  return a.scalar_type() == at::kHalf ? cpu::HalfType::kFloat16 : cpu::HalfType::kBFloat16;
}

at::Tensor w4a8_gemm_cpu(const at::Tensor& a, const at::Tensor& b_q_weight,
                         const at::Tensor& b_scales, const std::optional<at::Tensor>& b_zeros,
                         const std::optional<at::Tensor>& g_idx,
                         const std::optional<at::Tensor>& perm, int64_t num_bits, int64_t size_m,
                         int64_t size_n, int64_t size_k, bool is_k_full,
                         const std::optional<at::Tensor>& b_bias) {
  const W4a8GemmArgs args = check_w4a8_gemm_args(a, b_q_weight, b_scales, b_zeros, g_idx, perm,
                                                 num_bits, size_m, size_n, size_k, is_k_full,
                                                 b_bias, c10::DeviceType::CPU);
  cpu::W4a8Problem p{};
  p.format = cpu::A8Format::kMarlin;
  p.qweight = b_q_weight.data_ptr<int32_t>();
  p.scales = reinterpret_cast<const uint16_t*>(b_scales.data_ptr());
  p.zeros = args.has_zp ? b_zeros->data_ptr<int32_t>() : nullptr;
  p.size_m = size_m;
  p.size_n = size_n;
  p.size_k = size_k;
  p.num_groups = args.num_groups;
  p.group_size = args.group_size;
  p.block = cpu::a8_block_size(args.group_size);
  p.type = half_type(a);
  return run_w4a8(p, a, args.has_act_order ? perm->data_ptr<int32_t>() : nullptr,
                  args.has_bias ? b_bias : std::nullopt);
}

at::Tensor awq_gemm_a8_cpu(const at::Tensor& x, const at::Tensor& qweight,
                           const at::Tensor& scales, const at::Tensor& qzeros) {
  const W4a8GemmArgs args =
      check_awq_gemm_a8_args(x, qweight, scales, qzeros, c10::DeviceType::CPU);
  cpu::W4a8Problem p{};
  p.format = cpu::A8Format::kAwq;
  p.qweight = qweight.data_ptr<int32_t>();
  p.scales = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  p.zeros = qzeros.data_ptr<int32_t>();
  p.size_m = x.size(0);
  p.size_n = 8 * qweight.size(1);
  p.size_k = qweight.size(0);
  p.num_groups = args.num_groups;
  p.group_size = args.group_size;
  p.block = cpu::a8_block_size(args.group_size);
  p.type = half_type(x);
  return run_w4a8(p, x, nullptr, std::nullopt);
}

// The int8 mode is a CPU speed mode: there is no CUDA kernel (w4a16_gemm / awq_gemm are the
// GPU ops), and a CUDA call says so instead of the dispatcher's generic message.
at::Tensor w4a8_gemm_cuda(const at::Tensor& a, const at::Tensor&, const at::Tensor&,
                          const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                          const std::optional<at::Tensor>&, int64_t, int64_t, int64_t, int64_t,
                          bool, const std::optional<at::Tensor>&) {
  TORCH_CHECK(false, "w4a8_gemm: the int8-activation mode is CPU-only (no CUDA kernel); a is on ",
              a.device(), ": use w4a16_gemm on CUDA");
}

at::Tensor awq_gemm_a8_cuda(const at::Tensor& x, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&) {
  TORCH_CHECK(false, "awq_gemm_a8: the int8-activation mode is CPU-only (no CUDA kernel); x is "
              "on ", x.device(), ": use awq_gemm on CUDA");
}

}  // namespace

TORCH_LIBRARY_IMPL(w4kernels, CPU, m) {
  m.impl("w4a8_gemm", &w4a8_gemm_cpu);
  m.impl("awq_gemm_a8", &awq_gemm_a8_cpu);
}

TORCH_LIBRARY_IMPL(w4kernels, CUDA, m) {
  m.impl("w4a8_gemm", &w4a8_gemm_cuda);
  m.impl("awq_gemm_a8", &awq_gemm_a8_cuda);
}

}  // namespace w4k
