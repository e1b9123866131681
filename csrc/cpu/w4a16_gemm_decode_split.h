// Work split of the CPU w4a16_gemm decode path at M <= 4 (torch-free): the weight streamed as
// few long contiguous runs per thread.
//
// Why: at M <= 4 the op is a stream of the int4 weight, and the Marlin layout stores k-tile row
// kt as 8 * size_n contiguous bytes ([size_k / 16, 2 * size_n] int32). Splitting the columns
// (the path's split at larger M) gives each work item runs of 512 bytes per chunk of every
// k-tile row, rows 8 * size_n bytes apart, and the two threads interleave within every row.
// Here an item is a slice of whole k-tile rows (kDecodeSliceTiles of them: one contiguous range
// of the weight), split by columns only when there are too few slices to keep the threads busy.
// Measured (A/B alternating in one process, 2 threads, M = 1, bf16, machine shared at load 3-4):
// 8-15% faster than the column split on 4096x4096, 9% on 11008x4096, 18% on 4096x11008.
//
// Numerics: each slice sums its rows in fp32 exactly as the decode path sums all of K
// (pair_chunks_avx512), the raw sums of the slices are then added in slice order and the
// epilogue applied once: the contract up to fp32 summation order. The slices are fixed by K
// alone, so 1 and 2 threads give the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/w4a16_gemm_decode_amx.h"
#include "cpu/w4a16_gemm_decode_avx512.h"
#include "cpu/w4a16_gemm_kernel.h"
#include "cpu/w4a16_gemm_work_queue.h"

namespace w4k::cpu {

// k-tiles per block within a slice (pair_chunks_avx512's tiles_per_block): 8 rows of the whole
// weight row range, 256 KiB at N = 4096 (the next block is prefetched into L2 meanwhile).
// Measured (A/B alternating in one process, 2 threads, machine shared, load 3-4): blocks of 8
// were the fastest of 4 / 8 / 16 on 4096x4096, 11008x4096 and 4096x11008 (by 8-25%; 16, the
// column split's value, thrashes L2 with the prefetched block and the tables of every chunk).
constexpr int64_t kDecodeSplitBlockTiles = 8;
// Group of every k-tile of p into tile_group (K / 16 entries), -1 where its rows span groups (as
// in w4a16_gemm_cpu_chunks); whether any tile does.
inline bool decode_tile_groups(const W4a16GemmProblem& p, std::vector<int32_t>& tile_group) {
  const int64_t num_tiles = p.size_k / 16;
  tile_group.resize(num_tiles);
  bool any_mixed_tile = false;
  for (int64_t kt = 0; kt < num_tiles; ++kt) {
    if (p.g_idx == nullptr) {
      tile_group[kt] = static_cast<int32_t>(16 * kt / p.group_size);
    } else {
      const int32_t* g = p.g_idx + 16 * kt;
      tile_group[kt] = std::all_of(g, g + 16, [&](int32_t x) { return x == g[0]; }) ? g[0] : -1;
      any_mixed_tile |= tile_group[kt] < 0;
    }
  }
  return any_mixed_tile;
}

// Whether the K-sliced split runs on the AMX tiles (w4a16_gemm_decode_amx.h): AMX-BF16, bf16
// activations, or fp16 ones that split into bf16 parts (p.amx_split_ok), M within
// w4a16_amx_decode_min_rows .. w4a16_amx_decode_max_rows, every k-tile in one group and the
// groups of each slice of K fewer than its k-tiles (sorted g_idx: always; per channel and groups
// of whole k-tiles: always).
inline bool w4a16_amx_decode_applies(const W4a16GemmProblem& p, CpuIsa isa) {
#ifdef W4K_HAVE_W4A16_AMX_DECODE
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  if ((fp16 && !p.amx_split_ok) || isa != CpuIsa::kAvx512Bf16 ||
      p.size_m > w4a16_amx_decode_max_rows(fp16) || p.size_m < w4a16_amx_decode_min_rows(fp16) ||
      !amx_bf16_enabled())
    return false;
  if (p.g_idx == nullptr) return p.group_size % 16 == 0;
  thread_local std::vector<int32_t> tile_group;
  if (decode_tile_groups(p, tile_group)) return false;
  const int64_t num_tiles = p.size_k / 16;
  for (int64_t kt0 = 0; kt0 < num_tiles; kt0 += kDecodeSliceTiles) {
    const int32_t* tg = tile_group.data();
    const int64_t kt1 = std::min(num_tiles, kt0 + kDecodeSliceTiles);
    const auto [lo, hi] = std::minmax_element(tg + kt0, tg + kt1);
    if (*hi - *lo >= kDecodeSliceTiles) return false;
  }
  return true;
#else
  (void)p;
  (void)isa;
  return false;
#endif
}

// Whether the K-sliced split runs: on the AMX tiles (p.amx_decode, set from the function above),
// else the decode path's own conditions (w4a16_gemm_cpu_chunks) at M <= 4 (decode_order_applies)
// on a CPU that has it. (bf16 activations always have their bf16 copy, p.a_bf16, on this path.)
inline bool w4a16_gemm_decode_split_applies(const W4a16GemmProblem& p, CpuIsa isa) {
#ifdef W4K_HAVE_AVX512_PATH
  // bf16 without AVX512-BF16: the decode path with vdpbf16ps emulated (pair_chunks_avx512 kEmu)
  return p.amx_decode ||
         (is_avx512(isa) && decode_order_applies(p) && p.size_m <= kDecodeSplitMaxRows);
#else
  (void)p;
  (void)isa;
  return false;
#endif
}

// c = epilogue(a @ w) for all of p (M <= kDecodeSplitMaxRows, on the AMX tiles M <=
// w4a16_amx_decode_max_rows), on `threads` threads of the work queue. Call only where
// w4a16_gemm_decode_split_applies.
inline void w4a16_gemm_decode_split(const W4a16GemmProblem& p, int threads) {
#ifdef W4K_HAVE_AVX512_PATH
  const int64_t num_tiles = p.size_k / 16, num_chunks = p.size_n / 64;
  const int64_t slices = (num_tiles + kDecodeSliceTiles - 1) / kDecodeSliceTiles;
  // Column parts of >= 8 chunks (4 KiB runs of a k-tile row), as many as it takes to give every
  // thread a few items (the queue balances them) and to keep an item's lane sums
  // (pair_chunks_avx512: rows * (256 + 64) floats per chunk for bf16, rows * (512 + 64) for
  // fp16, read and written in every k-block) within ~128 KiB of L2. No bits depend on the parts.
  // (Measured at M = 4, 11008 x 4096, load 3-4: the same time with and without this bound,
  // 0.94-1.04x the column split; 4096 x 4096 and 4096 x 11008: 0.90-0.92x.)
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  // bf16 on the AMX tiles (w4a16_gemm_decode_amx.h), whose sums stay in tile registers: no
  // bound on an item's chunks but the threads'.
  const bool amx = p.amx_decode;
  const int64_t acc_bytes_per_chunk = p.size_m * ((fp16 ? 512 : 256) + 64) * 4;
  const int64_t max_chunks =
      amx ? num_chunks : std::max<int64_t>(8, (128 << 10) / acc_bytes_per_chunk);
  int64_t parts = (num_chunks + max_chunks - 1) / max_chunks;
  while (slices * parts < 4 * threads && num_chunks / (2 * parts) >= 8) parts *= 2;
  const int64_t chunks_per_part = (num_chunks + parts - 1) / parts;
  thread_local std::vector<int32_t> tile_group;
  const bool any_mixed_tile = decode_tile_groups(p, tile_group);
  // Raw sums [slice][row][column], kept per calling thread: a fresh buffer per call would be
  // new pages (first-touch faults) whenever it is large.
  thread_local std::vector<float> part_sums;
  const int64_t slice_floats = p.size_m * p.size_n;
  if (static_cast<int64_t>(part_sums.size()) < slices * slice_floats)
    part_sums.resize(slices * slice_floats);
  float* part = part_sums.data();
  const int32_t* tg = tile_group.data();
  const bool emulate_dot = !fp16 && w4a16_gemm_cpu_isa() != CpuIsa::kAvx512Bf16;
  const bool fma_form = !fp16 && !emulate_dot && p.size_m >= w4a16_fma_min_rows();
#ifdef W4K_HAVE_W4A16_AMX_DECODE
  // x^T as B tiles for all of K, once per call
  thread_local Vector64<uint32_t> xt;
  if (amx) {
    xt.resize(amx_decode_x_dwords(p.size_k, amx_decode_x_blocks(p.size_m, fp16)));
    if (fp16) {
      thread_local std::vector<uint16_t> tmp;  // one row's split parts
      tmp.resize(2 * p.size_k);
      amx_decode_x_tiles_split(p.a, p.lda, p.size_m, p.size_k, tmp.data(), xt.data());
    } else {
      amx_decode_x_tiles(p.a_bf16, p.lda_bf16, p.size_m, p.size_k, xt.data());
    }
  }
  const uint32_t* xt_data = xt.data();  // the workers' own xt would be another thread_local
#endif
  WorkQueue::instance().run(slices * parts, threads, [&](int64_t item) {
    thread_local PairScratch scratch;
    const int64_t sl = item / parts, pa = item % parts;
    const int64_t ch0 = pa * chunks_per_part, ch1 = std::min(num_chunks, ch0 + chunks_per_part);
    if (ch0 >= ch1) return;
    const int64_t kt0 = sl * kDecodeSliceTiles, kt1 = std::min(num_tiles, kt0 + kDecodeSliceTiles);
    float* out = part + sl * slice_floats;
#ifdef W4K_HAVE_W4A16_AMX_DECODE
    if (amx) {
      AmxTileScope tiles(true);
      amx_decode_chunks(p, ch0, ch1, p.size_m, kt0, kt1, tg, xt_data, scratch.tbl, out);
      return;
    }
#endif
    if (fp16)
      pair_chunks_avx512<true>(p, ch0, ch1, 0, p.size_m, tg, any_mixed_tile, scratch, kt0, kt1,
                               out, kDecodeSplitBlockTiles);
    else if (emulate_dot)
      pair_chunks_avx512<false, true>(p, ch0, ch1, 0, p.size_m, tg, any_mixed_tile, scratch,
                                      kt0, kt1, out, kDecodeSplitBlockTiles);
    else if (fma_form)
      pair_chunks_avx512<false, true, true>(p, ch0, ch1, 0, p.size_m, tg, any_mixed_tile,
                                            scratch, kt0, kt1, out, kDecodeSplitBlockTiles);
    else
      pair_chunks_avx512<false>(p, ch0, ch1, 0, p.size_m, tg, any_mixed_tile, scratch, kt0, kt1,
                                out, kDecodeSplitBlockTiles);
  });
  // The slices added in slice order, then the epilogue (per channel: the scale of the fp32 sum).
  constexpr int64_t kChunksPerItem = 8;
  const bool per_channel = p.num_groups == 1;
  WorkQueue::instance().run((num_chunks + kChunksPerItem - 1) / kChunksPerItem, threads,
                            [&](int64_t item) {
    const int64_t ch1 = std::min(num_chunks, (item + 1) * kChunksPerItem);
    for (int64_t ch = item * kChunksPerItem; ch < ch1; ++ch) {
      float chan_scale[64], sc[64];
      if (per_channel) decode_chunk_groups(p, ch, sc, nullptr, chan_scale);
      for (int64_t i = 0; i < p.size_m; ++i) {
        float sum[64];
        const float* s0 = part + i * p.size_n + 64 * ch;
        std::memcpy(sum, s0, sizeof(sum));
        for (int64_t sl = 1; sl < slices; ++sl)
          for (int x = 0; x < 64; ++x) sum[x] += s0[sl * slice_floats + x];
        float* c_row = p.c + i * p.size_n + 64 * ch;
        const float* bias = p.bias ? p.bias + 64 * ch : nullptr;
        for (int x = 0; x < 64; ++x)
          c_row[x] = epilogue(sum[x], per_channel ? chan_scale : nullptr, x, bias ? bias[x] : 0.0f);
      }
    }
  });
#else
  (void)p;
  (void)threads;
#endif
}

}  // namespace w4k::cpu
