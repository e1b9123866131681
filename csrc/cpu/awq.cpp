// CPU binding of awq_dequantize and awq_gemm (AutoAWQ WQLinear_GEMM weights), and the
// awq_dequantize kernel; the awq_gemm kernel is in awq_gemm_cpu.h (its numerics are there).
//
// awq_dequantize works in blocks of 64 columns (8 int32 words per row). A weight element is
//   w[k, n] = round_to_dtype((q[k, n] - z[g, n]) * s[g, n]),   g = k / group_size,
// where the product is exact in fp32 (a 5-bit integer times a 16-bit float), so rounding it to
// fp16/bf16 is the single rounding the GPU kernels do before their fp32-accumulating mma.
// Every ISA path (isa.h) performs exactly these operations, so all paths agree bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "awq_checks.h"
// GCC 12 flags the _mm512_undefined_* operands inside its own AVX-512 intrinsics (e.g.
// _mm512_cvtph_ps, inlined from the kernels below) as uninitialized at -O3.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "cpu/awq_gemm_cpu.h"
#include "cpu/awq_gemm_cpu_amx.h"
#include "cpu/awq_gemm_cpu_avx2.h"
#include "cpu/awq_gemm_cpu_lut.h"
#include "cpu/isa.h"
#include "cpu/w4a16_gemm_work_queue.h"

namespace w4k {
namespace {

// This thread's kernel scratch of `floats` floats, 64-byte aligned (grown, never shrunk): work
// items run on whichever thread claims them (cpu/w4a16_gemm_work_queue.h).
float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats + 16) buf.resize(floats + 16);
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((p + 63) / 64 * 64);
}

constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column 8c + j is nibble kAwqNibble[j]
constexpr int64_t kBlockN = 64;                          // columns per block (8 words)

// One group's zero points and scales for a 64-column block, as floats in column order
// (columns past N: zero, so they dequantize to 0).
struct GroupParams {
  alignas(64) float z[64];
  alignas(64) float s[64];
};

template <typename scalar_t>
void load_group(const int32_t* qzeros, const scalar_t* scales, int64_t size_n, int64_t g,
                int64_t n0, int64_t ncols, GroupParams& p) {
  for (int64_t j = 0; j < kBlockN; ++j) {
    if (j < ncols) {
      const uint32_t word = qzeros[g * (size_n / 8) + (n0 + j) / 8];
      p.z[j] = static_cast<float>((word >> (4 * kAwqNibble[j % 8])) & 15);
      p.s[j] = static_cast<float>(scales[g * size_n + n0 + j]);
    } else {
      p.z[j] = p.s[j] = 0.0f;
    }
  }
}

// ---- portable path ---------------------------------------------------------------------------

template <typename scalar_t>
inline scalar_t dequant_scalar(uint32_t word, int64_t j, const GroupParams& p) {
  const float q = static_cast<float>((word >> (4 * kAwqNibble[j % 8])) & 15);
  return static_cast<scalar_t>((q - p.z[j]) * p.s[j] + 0.0f);  // + 0: -0 -> +0, as fma(.., +0)
}

template <typename scalar_t>
void dequant_rows_scalar(const int32_t* qrow, int64_t ldq, int64_t rows, int64_t ncols,
                         const GroupParams& p, scalar_t* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ncols; ++j)
      out[r * ldo + j] = dequant_scalar<scalar_t>(qrow[r * ldq + j / 8], j, p);
}

// ---- AVX-512 path ----------------------------------------------------------------------------

#define W4K_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

// Codes of columns 16*pair .. 16*pair+15 from the 8 words in lanes 0..7 of `words`: lane l
// takes word 2*pair + l/8 and shifts it by 4 * kAwqNibble[l % 8].
W4K_AVX512 inline __m512 decode16(__m512i words, int pair) {
  const __m512i idx = _mm512_add_epi32(
      _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_set1_epi32(2 * pair));
  const __m512i shifts =
      _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28, 0, 16, 4, 20, 8, 24, 12, 28);
  const __m512i q = _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_permutexvar_epi32(idx, words), shifts), _mm512_set1_epi32(15));
  return _mm512_cvtepi32_ps(q);
}

// fp32 -> fp16/bf16 bit patterns, round to nearest even (NaN stays NaN).
template <typename scalar_t>
W4K_AVX512 inline __m256i round_bits(__m512 v) {
  if constexpr (std::is_same_v<scalar_t, at::Half>) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16),
                                                      _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
}

template <typename scalar_t>
W4K_AVX512 inline __m512 bits_to_f32(__m256i h) {
  if constexpr (std::is_same_v<scalar_t, at::Half>) {
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Rounded weights of 16 columns: (q - z) * s + 0, as 16-bit patterns.
template <typename scalar_t>
W4K_AVX512 inline __m256i dequant16(__m512i words, int pair, const GroupParams& p) {
  const __m512 q = decode16(words, pair);
  const __m512 z = _mm512_load_ps(p.z + 16 * pair), s = _mm512_load_ps(p.s + 16 * pair);
  return round_bits<scalar_t>(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(q, z), s),
                                            _mm512_setzero_ps()));
}

template <typename scalar_t>
W4K_AVX512 void dequant_rows_avx512(const int32_t* qrow, int64_t ldq, int64_t rows,
                                    int64_t ncols, const GroupParams& p, scalar_t* out,
                                    int64_t ldo) {
  const __mmask8 word_mask = static_cast<__mmask8>((1u << (ncols / 8)) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512i words = _mm512_castsi256_si512(_mm256_maskz_loadu_epi32(word_mask, qrow + r * ldq));
    for (int pair = 0; 16 * pair < ncols; ++pair) {
      const __mmask16 col_mask = ncols - 16 * pair >= 16 ? 0xFFFF : 0x00FF;
      _mm256_mask_storeu_epi16(out + r * ldo + 16 * pair, col_mask,
                               dequant16<scalar_t>(words, pair, p));
    }
  }
}

// ---- kernels ---------------------------------------------------------------------------------

template <typename scalar_t>
void awq_dequantize_kernel(const int32_t* qweight, const scalar_t* scales, const int32_t* qzeros,
                           int64_t size_k, int64_t size_n, int64_t groups, scalar_t* out) {
  const int64_t group_size = size_k / groups;
  const int64_t blocks_n = (size_n + kBlockN - 1) / kBlockN;
  const bool simd = cpu_isa() == Isa::kAvx512;
  at::parallel_for(0, groups * blocks_n, 1, [&](int64_t begin, int64_t end) {
    GroupParams p;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / blocks_n, n0 = (task % blocks_n) * kBlockN;
      const int64_t ncols = std::min(kBlockN, size_n - n0);
      load_group(qzeros, scales, size_n, g, n0, ncols, p);
      const int32_t* qrow = qweight + g * group_size * (size_n / 8) + n0 / 8;
      scalar_t* dst = out + g * group_size * size_n + n0;
      if (simd)
        dequant_rows_avx512(qrow, size_n / 8, group_size, ncols, p, dst, size_n);
      else
        dequant_rows_scalar(qrow, size_n / 8, group_size, ncols, p, dst, size_n);
    }
  });
}

// Runs the awq_gemm kernel (awq_gemm_cpu.h) over work items of 256 columns on the CPU GEMMs'
// work queue (cpu/w4a16_gemm_work_queue.h: a thread that the OS preempts delays only the item
// it holds, the other thread takes the rest); items are large enough (the whole K) that the
// counter costs nothing. Each column is summed by one item, so the bits do not depend on the
// thread count.
// AVX2 path (awq_gemm_cpu_avx2.h): CPUs with AVX2 + FMA + F16C but not the AVX-512 path's
// BF16 / VBMI, or W4K_CPU_ISA=avx2. Work items of 256 columns x all M (the lookups at M <= 4:
// up to 1024, lut_avx2_blocks), summed in the order of the portable path the shape selects; x
// widened to fp32 once (exact).
// bf16 x as fp32 [M, K], contiguous (exact).
std::vector<float> widen_bf16_rows(const awq_cpu::Problem& pb) {
  std::vector<float> xf(pb.size_m * pb.size_k);
  for (int64_t m = 0; m < pb.size_m; ++m)
    for (int64_t k = 0; k < pb.size_k; ++k)
      xf[m * pb.size_k + k] = awq_cpu::bf16_to_float(pb.x[m * pb.ldx + k]);
  return xf;
}

template <awq_cpu::Dtype D>
void awq_gemm_run_avx2(const awq_cpu::Problem& pb, const float* xf) {
  const bool lut_order = awq_cpu::lut_path_applies<D>(pb);
  std::vector<float> xbuf;
  if (xf == nullptr) {  // bf16
    xbuf = widen_bf16_rows(pb);
    xf = xbuf.data();
  }
  const int64_t chunk_cols = awq_cpu::kChunkBlocks * awq_cpu::kBlockN;
  const int64_t chunks = (pb.size_n + chunk_cols - 1) / chunk_cols;
  // Lookup order by table lookups (chunk_lut_avx2); W4K_AWQ_AVX2_LOOKUP=0 selects the fp32
  // strip decode in the same order (chunk_avx2: the same bits; a test and benchmark knob).
  const char* env = std::getenv("W4K_AWQ_AVX2_LOOKUP");
  if (lut_order && !(env && std::strcmp(env, "0") == 0)) {
    std::vector<float> xe;
    if constexpr (D == awq_cpu::Dtype::kBFloat16) {
      xe.resize(pb.size_m * pb.size_k * 2);
      awq_cpu::lut_avx2_bf16_x(xf, pb.size_m, pb.size_k, xe.data());
    }
    const float* x = D == awq_cpu::Dtype::kBFloat16 ? xe.data() : xf;
    const int64_t blocks = awq_cpu::lut_avx2_blocks(pb.size_m, pb.size_n, at::get_num_threads());
    const int64_t cols = blocks * awq_cpu::kBlockN;
    const int64_t floats =
        awq_cpu::lut_avx2_scratch_floats<D>(pb.size_m, blocks, pb.size_k / pb.groups);
    cpu::WorkQueue::instance().run((pb.size_n + cols - 1) / cols, at::get_num_threads(),
                                   [&](int64_t c) {
      const int64_t n0 = c * cols, n1 = std::min(pb.size_n, n0 + cols);
      awq_cpu::chunk_lut_avx2<D>(pb, x, n0, n1, thread_scratch(floats));
    });
    return;
  }
  const int64_t floats = awq_cpu::avx2_scratch_floats(pb.size_m, awq_cpu::avx2_lanes<D>(lut_order));
  cpu::WorkQueue::instance().run(chunks, at::get_num_threads(), [&](int64_t c) {
    const int64_t n0 = c * chunk_cols, n1 = std::min(pb.size_n, n0 + chunk_cols);
    awq_cpu::chunk_avx2<D>(pb, xf, n0, n1, lut_order, thread_scratch(floats));
  });
}

// x: the activations pb.x points into. fp16 needs them widened to fp32 (exact, once per call)
// on the FMA paths, and split into bf16 hi and lo parts (cpu/amx_bf16.h) on the AMX tiles.
template <awq_cpu::Dtype D>
void awq_gemm_run(awq_cpu::Problem pb, const at::Tensor& x) {
  constexpr bool kFp16 = D == awq_cpu::Dtype::kHalf;
  const Isa isa = cpu_isa();
  const bool simd = isa == Isa::kAvx512 && __builtin_cpu_supports("avx512bf16") &&
                    __builtin_cpu_supports("avx512vbmi");
  at::Tensor x32;
  auto widen = [&]() -> const float* {
    if (!kFp16) return nullptr;
    x32 = x.to(at::kFloat).contiguous();
    return x32.data_ptr<float>();
  };
  if (!simd && isa >= Isa::kAvx2) return awq_gemm_run_avx2<D>(pb, widen());
  const bool amx = simd && cpu::amx_bf16_enabled();
  if (simd && awq_cpu::row_path_applies<D>(pb, amx)) {
    // The row path (awq_gemm_cpu_rows.h): the tile path's bits from AutoAWQ's rows as stored.
    RECORD_FUNCTION("w4kernels::awq_gemm[rows]", std::vector<c10::IValue>());
    const int64_t threads = at::get_num_threads();
    const std::vector<float> xf = widen_bf16_rows(pb);  // the fma form's x
    const int64_t lines = awq_cpu::row_lines(pb.size_n, threads);
    const int64_t cols = 128 * lines;
    const int64_t floats = awq_cpu::row_scratch_floats(pb.size_m, lines);
    const bool fma = pb.size_m >= awq_cpu::lut_fma_min_rows();  // as the lookups
    cpu::WorkQueue::instance().run((pb.size_n + cols - 1) / cols, threads, [&](int64_t c) {
      const int64_t n0 = c * cols, n1 = std::min(pb.size_n, n0 + cols);
      float* scratch = thread_scratch(floats);
      switch (pb.size_m) {
        case 1: return awq_cpu::chunk_rows<1>(pb, xf.data(), n0, n1, fma, scratch);
        case 2: return awq_cpu::chunk_rows<2>(pb, xf.data(), n0, n1, fma, scratch);
        default: return awq_cpu::chunk_rows<3>(pb, xf.data(), n0, n1, fma, scratch);
      }
    });
    return;
  }
  const bool lut = awq_cpu::lut_path_applies<D>(pb, amx);
  // fp16 with the weights as the A operand (awq_gemm_cpu_amx.h) from fewer rows than the other
  // tile path's split
  const bool t_fp16 = kFp16 && amx && !lut && awq_cpu::amx_t_fp16_applies(pb);
  const bool tiles_amx =
      amx && !lut && (!kFp16 || t_fp16 || pb.size_m >= awq_cpu::amx_fp16_min_rows());
  std::vector<uint16_t> xs;  // fp16 on the tiles: x as split rows
  const float* xf = nullptr;
#ifdef W4K_HAVE_AMX_SPLIT
  if (kFp16 && tiles_amx &&
      cpu::amx_split_activations_ok(pb.x, pb.size_m, pb.size_k, pb.ldx) &&
      cpu::amx_split_scales_ok(pb.scales, pb.groups * pb.size_n)) {
    pb.ldxs = pb.size_k + 32;  // not a multiple of 1024 halves (L1 set aliasing of the rows)
    const int64_t rows = cpu::amx_split_tile_rows(pb.size_m);
    xs.assign(rows * pb.ldxs, 0);  // rows past M stay zero
    cpu::WorkQueue::instance().run(pb.size_m, at::get_num_threads(), [&](int64_t m) {
      cpu::amx_split_half_row(pb.x + m * pb.ldx, pb.size_k,
                              xs.data() + cpu::amx_split_row(m, 0) * pb.ldxs,
                              xs.data() + cpu::amx_split_row(m, 1) * pb.ldxs);
    });
    pb.xs = xs.data();
  }
#endif
#ifdef W4K_HAVE_AMX_PATH
  // The tiles with the weights as the A operand (awq_gemm_cpu_amx.h; fp16: its split rows made
  // above): x as B tiles once per call, then work items of 4 lines (512 columns) x every row.
  if (kFp16 ? t_fp16 && pb.xs != nullptr : tiles_amx && awq_cpu::amx_t_applies(pb)) {
    // A profiler event names the path (tests check that it ran: its bits are the other tile
    // path's by design).
    RECORD_FUNCTION("w4kernels::awq_gemm[amx weights as A]", std::vector<c10::IValue>());
    // Every dword is written by amx_t_x_tiles: not zeroed first (x's size, 90 MB at M = 4096).
    const auto xt = cpu::make_uninit64<uint32_t>(awq_cpu::amx_t_x_dwords(pb));
    const int64_t threads = at::get_num_threads();
    cpu::WorkQueue::instance().run(
        awq_cpu::amx_t_row_blocks(awq_cpu::amx_t_tile_rows(pb)), threads,
        [&](int64_t rb) { awq_cpu::amx_t_x_tiles(pb, rb, xt.get()); });
    const int64_t lines = awq_cpu::amx_t_item_lines(
        awq_cpu::amx_t_row_blocks(awq_cpu::amx_t_tile_rows(pb)), pb.size_n, threads);
    const int64_t cols = lines * awq_cpu::kAmxTLine;
    const int64_t floats = awq_cpu::amx_t_scratch_floats(awq_cpu::amx_t_tile_rows(pb), lines);
    cpu::WorkQueue::instance().run((pb.size_n + cols - 1) / cols, threads, [&](int64_t c) {
      const int64_t n0 = c * cols, n1 = std::min(pb.size_n, n0 + cols);
      if (kFp16)
        awq_cpu::chunk_amx_t<true>(pb, xt.get(), n0, n1, thread_scratch(floats));
      else
        awq_cpu::chunk_amx_t<false>(pb, xt.get(), n0, n1, thread_scratch(floats));
    });
    return;
  }
#endif
  if (!pb.xs) xf = widen();
  const bool on_tiles = tiles_amx && (!kFp16 || pb.xs != nullptr);  // fp16: split rows made
  // Work items: (column chunk, block of rows of x).
  const int64_t chunk_blocks = !on_tiles ? awq_cpu::kChunkBlocks
                               : pb.size_m >= awq_cpu::kAmxManyRows
                                   ? awq_cpu::kChunkBlocksAmx
                                   : awq_cpu::kChunkBlocksAmxFewRows;
  const int64_t lut_lines =
      lut ? awq_cpu::lut_lines(pb.size_m, pb.size_n, at::get_num_threads()) : 0;
  const int64_t chunk_cols = lut ? 128 * lut_lines : chunk_blocks * awq_cpu::kBlockN;
  const int64_t m_block = lut ? awq_cpu::kLutMBlock : pb.size_m;
  const int64_t col_chunks = (pb.size_n + chunk_cols - 1) / chunk_cols;
  const int64_t chunks = col_chunks * ((pb.size_m + m_block - 1) / m_block);
  const int64_t floats =
      !simd ? 0
      : lut ? awq_cpu::lut_scratch_floats(pb.size_m, lut_lines)
            : awq_cpu::scratch_floats(awq_cpu::chunk_acc_rows(pb), chunk_blocks);
  cpu::WorkQueue::instance().run(chunks, at::get_num_threads(), [&](int64_t c) {
    const int64_t n0 = (c % col_chunks) * chunk_cols, n1 = std::min(pb.size_n, n0 + chunk_cols);
    const int64_t m0 = (c / col_chunks) * m_block, m1 = std::min(pb.size_m, m0 + m_block);
    if (lut && simd)
      awq_cpu::chunk_lut<D>(pb, xf, n0, n1, m0, m1, thread_scratch(floats));
    else if (lut)
      awq_cpu::chunk_lut_scalar<D>(pb, n0, n1, m0, m1);
    else if (simd)
      awq_cpu::chunk_avx512<D>(pb, xf, n0, n1, thread_scratch(floats),
                               on_tiles, chunk_blocks);
    else
      awq_cpu::chunk_scalar<D>(pb, n0, n1);
  });
}

at::Tensor awq_dequantize_cpu(const at::Tensor& qweight, const at::Tensor& scales,
                              const at::Tensor& qzeros, c10::SymInt split_k_iters, int64_t thx,
                              int64_t thy) {
  check_awq_dequantize_args(qweight, scales, qzeros, c10::DeviceType::CPU);
  const int64_t size_k = qweight.size(0), size_n = qweight.size(1) * 8;
  at::Tensor out = at::empty({size_k, size_n}, scales.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(scales.scalar_type(), "awq_dequantize_cpu", [&] {
    awq_dequantize_kernel<scalar_t>(qweight.data_ptr<int32_t>(), scales.data_ptr<scalar_t>(),
                                    qzeros.data_ptr<int32_t>(), size_k, size_n, scales.size(0),
                                    out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor awq_gemm_cpu(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                        const at::Tensor& qzeros, c10::SymInt split_k_iters) {
  check_awq_gemm_args(x, qweight, scales, qzeros, split_k_iters.expect_int(),
                      c10::DeviceType::CPU);
  const int64_t size_m = x.size(0), size_k = qweight.size(0), size_n = qweight.size(1) * 8;
  at::Tensor out = at::empty({size_m, size_n}, x.options());
  if (size_m == 0) return out;
  awq_cpu::Problem pb{reinterpret_cast<const uint16_t*>(x.data_ptr()), x.stride(0),
                      qweight.data_ptr<int32_t>(), reinterpret_cast<const uint16_t*>(scales.data_ptr()),
                      qzeros.data_ptr<int32_t>(), size_m, size_k, size_n, scales.size(0),
                      reinterpret_cast<uint16_t*>(out.data_ptr())};
  if (x.scalar_type() == at::kHalf)
    awq_gemm_run<awq_cpu::Dtype::kHalf>(pb, x);
  else
    awq_gemm_run<awq_cpu::Dtype::kBFloat16>(pb, x);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(w4kernels, CPU, m) {
  m.impl("awq_dequantize", &awq_dequantize_cpu);
  m.impl("awq_gemm", &awq_gemm_cpu);
}

}  // namespace w4k
