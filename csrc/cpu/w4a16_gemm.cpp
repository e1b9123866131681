// CPU binding of w4a16_gemm (vLLM gptq_marlin_gemm semantics): checks, the torch-side
// preparation (a -> fp32 with the act-order column permutation applied, scales/bias -> fp32),
// the parallel split over 64-column chunks, and the final rounding to a's dtype.
// The kernel itself is torch-free: cpu/w4a16_gemm_kernel.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>  // at::get_num_threads
#include <torch/library.h>

#include <optional>
#include <vector>

#include "cpu/w4a16_gemm_convert.h"
#include "cpu/w4a16_gemm_dequant.h"
#include "cpu/w4a16_gemm_kernel.h"
#include "cpu/w4a16_gemm_decode_split.h"
#include "cpu/w4a16_gemm_work_queue.h"
#include "w4a16_checks.h"

namespace w4k {
namespace {

// The kernel problem's weight side (the activations, bias and output are each route's own).
cpu::W4a16GemmProblem weight_problem(const at::Tensor& b_q_weight, const at::Tensor& b_scales,
                                     const std::optional<at::Tensor>& b_zeros,
                                     const std::optional<at::Tensor>& g_idx,
                                     const W4a16GemmArgs& args, int64_t size_m, int64_t size_n,
                                     int64_t size_k, cpu::HalfType type) {
  cpu::W4a16GemmProblem p{};
  p.b_q_weight = b_q_weight.data_ptr<int32_t>();
  p.scales = reinterpret_cast<const uint16_t*>(b_scales.data_ptr());
  p.zeros = args.has_zp ? b_zeros->data_ptr<int32_t>() : nullptr;
  p.g_idx = args.has_act_order ? g_idx->data_ptr<int32_t>() : nullptr;
  p.size_m = size_m;
  p.size_n = size_n;
  p.size_k = size_k;
  p.num_groups = args.num_groups;
  p.group_size = args.group_size;
  p.weight_type = type;
  return p;
}

// The many-rows route: w [K, N] = T((q - z) * s) decoded on the work queue (items: 64-column
// 64 rows x N), a gathered by perm for act-order (also on the queue), then
// at::addmm(bias, a, w) / at::mm(a, w). torch's half GEMM accumulates in fp32 and adds the bias
// in fp32 before its one rounding to T (tests/test_w4a16_gemm_dense.py checks both), which is
// the grouped contract up to summation order.
at::Tensor w4a16_gemm_cpu_dense(const at::Tensor& a, const at::Tensor& b_q_weight,
                                const at::Tensor& b_scales,
                                const std::optional<at::Tensor>& b_zeros,
                                const std::optional<at::Tensor>& g_idx,
                                const std::optional<at::Tensor>& perm,
                                const std::optional<at::Tensor>& b_bias,
                                const W4a16GemmArgs& args, int64_t size_m, int64_t size_n,
                                int64_t size_k, cpu::HalfType type, cpu::CpuIsa isa,
                                int64_t threads) {
  const cpu::W4a16GemmProblem p =
      weight_problem(b_q_weight, b_scales, b_zeros, g_idx, args, size_m, size_n, size_k, type);
  // The dense weight's buffer is kept per calling thread and reused (grown when a larger layer
  // comes): a fresh K x N allocation would be new pages from the OS on every call, and their
  // first-touch faults cost as much as the decode. It holds 2 K N bytes of the largest layer.
  thread_local at::Tensor w_cache;
  if (!w_cache.defined() || w_cache.numel() < size_k * size_n ||
      w_cache.scalar_type() != a.scalar_type())
    w_cache = at::empty({size_k * size_n}, a.options());
  at::Tensor w = w_cache.narrow(0, 0, size_k * size_n).view({size_k, size_n});
  uint16_t* w_bits = reinterpret_cast<uint16_t*>(w.data_ptr());
  constexpr int64_t kTilesPerItem = 4;  // 64 rows x N columns per item
  const int64_t num_tiles = size_k / 16;
  cpu::WorkQueue::instance().run((num_tiles + kTilesPerItem - 1) / kTilesPerItem,
                                 static_cast<int>(threads), [&](int64_t item) {
    const int64_t kt0 = item * kTilesPerItem;
    cpu::dequant_rows_to_half(p, kt0, std::min(num_tiles, kt0 + kTilesPerItem), isa, w_bits,
                              size_n);
  });
  at::Tensor a_rows = a;  // [M, K] view, unit stride along K (checked)
  if (args.has_act_order) {
    // a_rows[:, r] = a[:, perm[r]]: the Marlin row order of w.
    a_rows = at::empty({size_m, size_k}, a.options());
    const uint16_t* src = reinterpret_cast<const uint16_t*>(a.data_ptr());
    uint16_t* dst = reinterpret_cast<uint16_t*>(a_rows.data_ptr());
    const int32_t* perm_ptr = perm->data_ptr<int32_t>();
    const int64_t lda = a.stride(0);
    cpu::WorkQueue::instance().run(size_m, static_cast<int>(threads), [&](int64_t m) {
      for (int64_t r = 0; r < size_k; ++r) dst[m * size_k + r] = src[m * lda + perm_ptr[r]];
    });
  }
  return args.has_bias ? at::addmm(*b_bias, a_rows, w) : at::mm(a_rows, w);
}

at::Tensor w4a16_gemm_cpu(const at::Tensor& a, const at::Tensor& b_q_weight,
                          const at::Tensor& b_scales, const std::optional<at::Tensor>& b_zeros,
                          const std::optional<at::Tensor>& g_idx,
                          const std::optional<at::Tensor>& perm, at::Tensor& workspace,
                          int64_t num_bits, int64_t size_m, int64_t size_n, int64_t size_k,
                          bool is_k_full, const std::optional<at::Tensor>& b_bias,
                          bool use_fp32_reduce) {
  // use_fp32_reduce: the CPU kernel never splits K, every sum is one fp32 accumulator.
  (void)use_fp32_reduce;
  const W4a16GemmArgs args =
      check_w4a16_gemm_args(a, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace, num_bits,
                            size_m, size_n, size_k, is_k_full, b_bias, c10::DeviceType::CPU);
  if (size_m == 0) return at::empty({0, size_n}, a.options());

  // a_perm[:, r] = a[:, perm[r]] in fp32 (this also absorbs a row stride > K); bf16
  // activations also as gathered bf16 (the vdpbf16ps paths read pairs of them). The fp32 copy
  // gets a row stride of K + 16: with K a multiple of 1024, rows K floats apart would all map to
  // the same L1 sets, and the microkernel reads 6 rows at once. These conversions, the scales
  // (read as half bits by the kernel) and the final rounding run on the kernel's work queue, not
  // as torch ops (cpu/w4a16_gemm_convert.h says why).
  const cpu::HalfType type =
      a.scalar_type() == at::kHalf ? cpu::HalfType::kFloat16 : cpu::HalfType::kBFloat16;
  const cpu::CpuIsa isa = cpu::w4a16_gemm_cpu_isa();
  const bool avx512 = cpu::is_avx512(isa);
  const int64_t threads = at::get_num_threads();
  // Many rows, grouped: dequantize once + torch's matmul (cpu/w4a16_gemm_dequant.h).
  // Per-channel stays on the kernel: its contract scales the fp32 sum, and torch has no CPU
  // matmul of half inputs with an fp32 result to keep that sum (aten::mm.dtype is CUDA-only).
  if (args.num_groups > 1 && size_m >= cpu::w4a16_gemm_dequant_threshold(type))
    return w4a16_gemm_cpu_dense(a, b_q_weight, b_scales, b_zeros, g_idx, perm, b_bias, args,
                                size_m, size_n, size_k, type, isa, threads);
  cpu::W4a16GemmProblem p =
      weight_problem(b_q_weight, b_scales, b_zeros, g_idx, args, size_m, size_n, size_k, type);
  at::Tensor bias32;
  if (args.has_bias) bias32 = b_bias->to(at::kFloat).contiguous();  // N elements: serial
  p.bias = args.has_bias ? bias32.data_ptr<float>() : nullptr;
  at::Tensor out = at::empty({size_m, size_n}, a.options());
  const bool gather_bf16 = type == cpu::HalfType::kBFloat16;
  // fp16 on a CPU with AMX tiles: the tile paths take a split into bf16 hi and lo parts
  // (cpu/amx_bf16.h, amx_split_half) where every value splits (the scans read the activations
  // and the scales, only where the tiles can run).
  p.amx_split_ok =
      type == cpu::HalfType::kFloat16 && isa == cpu::CpuIsa::kAvx512Bf16 &&
      cpu::amx_bf16_enabled() &&
      cpu::amx_split_activations_ok(reinterpret_cast<const uint16_t*>(a.data_ptr()), size_m,
                                    size_k, a.stride(0)) &&
      cpu::amx_split_scales_ok(reinterpret_cast<const uint16_t*>(b_scales.data_ptr()),
                               b_scales.numel());
  // M <= 4 on the decode path, and at M <= 12 (bf16) / 3..16 (fp16) on the AMX tiles: items of
  // whole k-tile rows that write fp32 sums (cpu/w4a16_gemm_decode_split.h).
  p.amx_decode = cpu::w4a16_amx_decode_applies(p, isa);
  const bool decode_split = cpu::w4a16_gemm_decode_split_applies(p, isa);
  const bool fp16_amx = p.amx_split_ok && !decode_split &&
                        size_m > cpu::w4a16_gemm_pair_max_rows(true, true);

  // Work items = (row block, group of consecutive 64-column chunks). Every item dequantizes its
  // chunks' weights once, so rows are split only when there are too few chunks to keep every
  // thread busy. Threads take items from a shared counter rather than a static split, and the
  // caller waits only for items other threads have claimed (cpu/w4a16_gemm_work_queue.h): on a
  // shared machine a thread that starts late then simply finds less work left, and one that
  // never gets a core costs nothing.
  const int64_t num_chunks = size_n / 64;
  int64_t row_blocks = 1;
  if (num_chunks < 4 * threads)
    row_blocks = std::max<int64_t>(1, std::min((4 * threads + num_chunks - 1) / num_chunks,
                                               size_m / 48));
  int64_t rows_per_block = (size_m + row_blocks - 1) / row_blocks;
  if (fp16_amx && row_blocks > 1) {  // blocks of whole 8-row blocks of the split rows
    rows_per_block = std::min(size_m, (rows_per_block + 7) / 8 * 8);
    row_blocks = (size_m + rows_per_block - 1) / rows_per_block;
  }
  const int64_t last_block_rows = size_m - (row_blocks - 1) * rows_per_block;
  // About 8 items per thread, their chunk counts differing by at most one. (A fixed count per
  // item left a short remainder: 11008 columns = 172 chunks were 17 items of 10 and one of 2,
  // so of two threads one ran 90 chunks and the other 82.)
  const int64_t items_per_row_block = std::max<int64_t>(1, std::min(num_chunks, 8 * threads));
  const int64_t num_items = items_per_row_block * row_blocks;

  // Every item on the blocked path (prefill): it writes its outputs rounded to a's dtype
  // itself (no fp32 result to store, read back and round: M x N x 8 bytes of traffic), and
  // with vdpbf16ps it reads only the bf16 copy of a (no fp32 one: M x K x 4 bytes).
  const cpu::W4a16RowPaths paths =
      cpu::w4a16_gemm_row_paths(p, rows_per_block, isa, gather_bf16 || fp16_amx);
  const cpu::W4a16RowPaths last_paths =
      cpu::w4a16_gemm_row_paths(p, last_block_rows, isa, gather_bf16 || fp16_amx);
  const bool blocked = paths.blocked() && last_paths.blocked() && !decode_split;
  const bool split_fp16 = fp16_amx && (paths.use_amx || last_paths.use_amx);
  // (bf16 on the decode split's tiles reads only the bf16 copy)
  const bool need_a32 = !(blocked && (paths.use_dpbf16 || paths.use_amx)) &&
                        !(gather_bf16 && p.amx_decode);

  // The scratch buffers (a as fp32 and bf16, the fp32 result) are kept per calling thread and
  // reused, grown when a larger call comes: fresh ones of many rows are new pages from the OS
  // on every call, whose first-touch faults and zeroing cost a few % of a prefill call
  // (M = 256 x N = 11008: 11 MiB of fp32 result alone). Calls that need more than
  // kKeptScratchBytes get a buffer of their own, freed on return, so a long prompt does not
  // pin its buffers for the life of the thread.
  constexpr size_t kKeptScratchBytes = size_t{64} << 20;
  thread_local std::vector<float> kept_scratch;
  std::vector<float> own_scratch;
  const int64_t lda = size_k + 16;
  // The bf16 copy gets a row stride of K + 32 for the same reason (the copy costs M * K * 2
  // bytes, next to the K * N / 2 of the weight).
  const int64_t lda_bf16 = size_k + 32;
  // floats: a32 [M, lda], c32 [M, N], a_bf16 [M + kAmxPadRows, lda_bf16] (2 bytes each; the
  // AMX tiles load 16 rows for a last row block of fewer; fp16 split: [amx_split_tile_rows(M),
  // lda_bf16]), 16-float aligned
  const int64_t a32_floats = need_a32 ? (size_m * lda + 15) / 16 * 16 : 0;
  const int64_t c32_floats = blocked ? 0 : (size_m * size_n + 15) / 16 * 16;
  const int64_t a16_rows = gather_bf16  ? size_m + cpu::kAmxPadRows
                           : split_fp16 ? cpu::amx_split_tile_rows(size_m)
                                        : 0;
  const int64_t bf16_floats = (a16_rows * lda_bf16 + 1) / 2;
  const size_t need = static_cast<size_t>(a32_floats + c32_floats + bf16_floats) + 16;
  std::vector<float>& scratch = need * sizeof(float) <= kKeptScratchBytes ? kept_scratch
                                                                          : own_scratch;
  if (scratch.size() < need) scratch.resize(need);
  // Plain pointers into the scratch (tensor views of it were three TensorImpls per call).
  float* const a32 = need_a32 ? scratch.data() : nullptr;
  float* const c32 = blocked ? nullptr : scratch.data() + a32_floats;
  uint16_t* const a_bf16 =
      a16_rows ? reinterpret_cast<uint16_t*>(scratch.data() + a32_floats + c32_floats) : nullptr;
  uint16_t* const out_bits = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t rows_per_item = std::max<int64_t>(1, size_m / (4 * threads));
  const int64_t row_items = (size_m + rows_per_item - 1) / rows_per_item;
  const uint16_t* a_bits = reinterpret_cast<const uint16_t*>(a.data_ptr());
  const int32_t* perm_ptr = args.has_act_order ? perm->data_ptr<int32_t>() : nullptr;
  cpu::WorkQueue::instance().run(row_items, static_cast<int>(threads), [&](int64_t item) {
    std::vector<uint16_t> gathered((perm_ptr && !gather_bf16) || split_fp16 ? size_k : 0);
    const int64_t m1 = std::min(size_m, (item + 1) * rows_per_item);
    for (int64_t m = item * rows_per_item; m < m1; ++m) {
      // fp16 split: the row (gathered) in `gathered`, then its parts from there
      cpu::prepare_a_row(a_bits + m * a.stride(0), perm_ptr, size_k, type, avx512,
                         a32 ? a32 + m * lda : nullptr,
                         gather_bf16 ? a_bf16 + m * lda_bf16
                                     : split_fp16 ? gathered.data() : nullptr,
                         gathered.data());
#ifdef W4K_HAVE_AMX_SPLIT
      if (split_fp16)
        cpu::amx_split_half_row(gathered.data(), size_k,
                                a_bf16 + cpu::amx_split_row(m, 0) * lda_bf16,
                                a_bf16 + cpu::amx_split_row(m, 1) * lda_bf16);
#endif
    }
  });
  if (split_fp16)  // the last 8-row block's rows past M: zero hi and lo parts
    for (int64_t m = size_m; m % cpu::kAmxSplitRows != 0; ++m)
      for (int h = 0; h < 2; ++h)
        std::memset(a_bf16 + cpu::amx_split_row(m, h) * lda_bf16, 0, sizeof(uint16_t) * size_k);

  p.a = a32;
  p.lda = lda;
  if (a_bf16 != nullptr) {
    p.a_bf16 = a_bf16;
    p.lda_bf16 = lda_bf16;
  }
  p.c = c32;
  p.out16 = blocked ? out_bits : nullptr;

  if (decode_split)
    cpu::w4a16_gemm_decode_split(p, static_cast<int>(threads));
  else
    cpu::WorkQueue::instance().run(num_items, static_cast<int>(threads), [&](int64_t item) {
      const int64_t rb = item / items_per_row_block, cg = item % items_per_row_block;
      const int64_t ch0 = cg * num_chunks / items_per_row_block;
      const int64_t ch1 = (cg + 1) * num_chunks / items_per_row_block;
      const int64_t m0 = rb * rows_per_block, m1 = std::min(size_m, m0 + rows_per_block);
      if (m0 < m1) cpu::w4a16_gemm_cpu_chunks(p, ch0, ch1, m0, m1, isa);
    });
  // One rounding of the fp32 result (bias included) to a's dtype (the blocked path did it).
  if (!blocked)
    cpu::WorkQueue::instance().run(row_items, static_cast<int>(threads), [&](int64_t item) {
      const int64_t m1 = std::min(size_m, (item + 1) * rows_per_item);
      for (int64_t m = item * rows_per_item; m < m1; ++m)
        cpu::narrow_c_row(c32 + m * size_n, size_n, type, avx512, out_bits + m * size_n);
    });
  return out;
}

std::vector<int64_t> cpu_thread_stats() {
  const cpu::WorkQueue::Stats s = cpu::WorkQueue::instance().stats();
  return {s.openmp_jobs, s.own_jobs, s.late_openmp_jobs, s.steered_wakes};
}

}  // namespace

TORCH_LIBRARY_IMPL(w4kernels, CPU, m) { m.impl("w4a16_gemm", &w4a16_gemm_cpu); }

// Takes no tensors: registered for every backend.
TORCH_LIBRARY_IMPL(w4kernels, CompositeExplicitAutograd, m) {
  m.impl("cpu_thread_stats", &cpu_thread_stats);
}

}  // namespace w4k
