"""What one core of this CPU can do with the instructions of the CPU GEMMs' inner loops.

Prints, for one thread:

* the reciprocal throughput of single 512-bit instructions (ns per instruction, 8 independent
  chains, and in cycles of the vpaddd rate, which is two per cycle on every AVX-512 core we
  know): the table lookups (vpermt2w, vpermw, vpermb, vpermt2d, vpshufb), the shuffles and shifts
  of the decode, and the dot products (vdpbf16ps, vpdpbusd, vfmadd);
* the bare decode loop of w4a16_gemm's M = 1 path (csrc/cpu/w4a16_gemm_decode_avx512.h,
  pair_pass_avx512 with one row): per 32 weights a 16-bit shift (none for nibble 0), a
  vpternlogd, a vpermt2w into a 64-entry bf16 table and a vdpbf16ps, on words and tables in L1:
  the rate at which one core can stream Marlin weights through that design, with no memory,
  table builds or loop bookkeeping of the real kernel;
* the same loop at M = 2, 3 and 4 rows with the kernel's lines per pass (pair_pass_avx512<M,
  2>: per line four lookups, then per row two activation loads and four vdpbf16ps): per core the
  weight stream the decode's instructions allow at each M, before memory, table builds and
  bookkeeping (2026-12-03, Zen 4 VM: 24.8 / 19.4 / 15.4 / 11.6 GB/s at M = 1 / 2 / 3 / 4), and
  the fp16 decode's loop likewise (pair_pass_avx512<M, 2 or 1, kFp16>: per 32 weights two
  vpermt2w into the tables of the fp32 weight's high and low halves, two vpunpck, per row an
  activation load and two FMAs);
* the M = 8 decode path's instruction mix per 64-byte line (a line load, four lookups, 16
  activation loads and 32 vdpbf16ps into 16 accumulators, as pair_pass_avx512<8, 1>), on L1
  data with no loop structure around it: the GFLOP/s the instructions allow, against which the
  op's M = 8 rate measures the cost of everything else;
* the weight traversal of the M <= 4 decode split (--traversal, two threads): Marlin-shaped
  weights ([K / 16, 8 N] bytes, copies rotated well past the L3) streamed with the M = 1
  decode's instruction mix per 64-byte line, in the order the kernel reads them (blocks of B
  k-tile rows; per 512-byte chunk the block's tiles in two passes of four lines; the next
  block's chunk prefetched on the first pass) for B = 8 (the kernel's), 4, 2, and in row order
  (each k-tile row start to end, no software prefetch), next to a plain read of the same
  copies: how much of the read bandwidth each order leaves once the decode's work is in the
  loop; plus a candidate decode that keeps the accumulators in registers and reads the tables
  from memory (two masked vpermw per 32 weights), which would allow short blocks, in blocks of
  1 / 2 / 4 / 8 rows and on a weight in cache (its compute rate);
* on a CPU with AMX-BF16, the TDPBF16PS rate (bench_cpu_gemm.py's probe: four C tiles, operands
  in tile registers).

So the M = 1 section of the README can say what bounds the op on a given CPU (Intel's
vpermt2w and vdpbf16ps take two cycles each where Zen 4's take one).

    PYTHONPATH=$PWD/python python benchmarks/probe_cpu_ops.py [--traversal]

(The cycle column takes two vpaddd per cycle, true of Zen 4 and Intel's AVX-512 cores; Zen 5
issues more, so there the ns column is the one to read.)
"""

import argparse
import os
import statistics
import sys

import torch
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define W4K_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16,avx512vnni,fma")))

// ns per instruction of op over 8 independent chains x[j] = op(t0, x[j], t1).
template <typename F>
W4K_TARGET static double chains(F op) {
  __m512i x[8];
  for (int i = 0; i < 8; ++i) x[i] = _mm512_set1_epi32(i * 7 + 1);
  // 1.0f / bf16 pairs (1.0, 1.0): normal floats (a denormal operand makes fma take a microcode
  // assist of ~160 cycles); the table and shuffle instructions do not care
  __m512i t0 = _mm512_set1_epi32(0x3f800000), t1 = _mm512_set1_epi32(0x3f803f80);
  __asm__("" : "+v"(t0), "+v"(t1));
  const int64_t n = 20000000;
  auto s = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) x[j] = op(t0, x[j], t1);
    __asm__ volatile("" : "+v"(x[0]), "+v"(x[1]), "+v"(x[2]), "+v"(x[3]), "+v"(x[4]),
                     "+v"(x[5]), "+v"(x[6]), "+v"(x[7]));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count() / (n * 8) * 1e9;
}

W4K_TARGET std::vector<std::pair<std::string, double>> instruction_ns() {
  using V = __m512i;
  std::vector<std::pair<std::string, double>> r;
  r.push_back({"vpaddd", chains([](V a, V x, V b) { return _mm512_add_epi32(x, a); })});
  r.push_back({"vpermt2w", chains([](V a, V x, V b) { return _mm512_permutex2var_epi16(a, x, b); })});
  r.push_back({"vpermt2b", chains([](V a, V x, V b) { return _mm512_permutex2var_epi8(a, x, b); })});
  r.push_back({"vpermt2d", chains([](V a, V x, V b) { return _mm512_permutex2var_epi32(a, x, b); })});
  r.push_back({"vpermw", chains([](V a, V x, V b) { return _mm512_permutexvar_epi16(x, a); })});
  r.push_back({"vpermb", chains([](V a, V x, V b) { return _mm512_permutexvar_epi8(x, a); })});
  r.push_back({"vpshufb", chains([](V a, V x, V b) { return _mm512_shuffle_epi8(a, x); })});
  r.push_back({"vshufi32x4", chains([](V a, V x, V b) { return _mm512_shuffle_i32x4(x, a, 0x44); })});
  r.push_back({"vpsrlw", chains([](V a, V x, V b) { return _mm512_srli_epi16(x, 4); })});
  r.push_back({"vpternlogd", chains([](V a, V x, V b) { return _mm512_ternarylogic_epi32(x, a, b, 0xea); })});
  r.push_back({"vdpbf16ps", chains([](V a, V x, V b) {
    return _mm512_castps_si512(_mm512_dpbf16_ps(_mm512_castsi512_ps(x), (__m512bh)a, (__m512bh)b)); })});
  r.push_back({"vpdpbusd", chains([](V a, V x, V b) { return _mm512_dpbusd_epi32(x, a, b); })});
  r.push_back({"vfmadd231ps", chains([](V a, V x, V b) {
    return _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b),
                                               _mm512_castsi512_ps(x))); })});
  return r;
}

// The decode's table index of nibble position e of the words x: a shift (none for e = 0) and a
// vpternlogd (index 16j + q: the code, and j = lane % 4 in bits 4..5).
__attribute__((target("avx512f,avx512bw"), always_inline))
inline __m512i pair_index(__m512i x, int e) {
  const __m512i code_mask = _mm512_set1_epi32(0x000f000f);
  const __m512i col_bits = _mm512_setr_epi32(0, 0x100010, 0x200020, 0x300030, 0, 0x100010,
      0x200020, 0x300030, 0, 0x100010, 0x200020, 0x300030, 0, 0x100010, 0x200020, 0x300030);
  const __m512i s = e == 0 ? x : _mm512_srli_epi16(x, 4 * e);
  return _mm512_ternarylogic_epi32(s, code_mask, col_bits, 0xea);
}

// The same index with kTop: e = 3 by one vpshldw (AVX512-VBMI2), as the kernel at M <= 3 on a
// CPU that has it (pair_index_at<true>).
template <bool kTop>
__attribute__((target("avx512f,avx512bw,avx512vbmi2"), always_inline))
inline __m512i pair_index_k(__m512i x, int e) {
  if (kTop && e == 3)
    return _mm512_shldi_epi16(_mm512_setr_epi32(0, 0x10001, 0x20002, 0x30003, 0, 0x10001,
        0x20002, 0x30003, 0, 0x10001, 0x20002, 0x30003, 0, 0x10001, 0x20002, 0x30003), x, 4);
  return pair_index(x, e);
}

// The decode's lookup of nibble position e: its index and a vpermt2w into the 64-entry table
// (t0, t1).
__attribute__((target("avx512f,avx512bw"), always_inline))
inline __m512i lookup(__m512i x, int e, __m512i t0, __m512i t1) {
  return _mm512_permutex2var_epi16(t0, pair_index(x, e), t1);
}

template <bool kTop>
__attribute__((target("avx512f,avx512bw,avx512vbmi2"), always_inline))
inline __m512i lookup_k(__m512i x, int e, __m512i t0, __m512i t1) {
  return _mm512_permutex2var_epi16(t0, pair_index_k<kTop>(x, e), t1);
}

// The decode path's inner loop (pair_pass_avx512<MR, NCP>, MR rows, NCP lines of each k-tile
// per pass): per line four lookups (a shift (none for nibble 0), a vpternlogd (index 16j + q),
// a vpermt2w), then per row its two activation vectors (loaded) each serving two vdpbf16ps into
// the line's two accumulators of that row. Words (16 k-tiles), activations (8 k-tiles) and
// tables stay in L1; no table builds, loop bookkeeping or memory of the real kernel.
template <int MR, int NCP, bool kTop>
__attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi2"), noipa))
static float rows_loop(const int32_t* words, int64_t tiles, const __m512i* a_pairs,
                       const uint16_t* tbl) {
  __m512i t0[2 * NCP], t1[2 * NCP];
  for (int i = 0; i < 2 * NCP; ++i) {
    t0[i] = _mm512_loadu_si512(tbl + 64 * i);
    t1[i] = _mm512_loadu_si512(tbl + 64 * i + 32);
  }
  __m512 acc[MR][2 * NCP];
  for (int i = 0; i < MR; ++i)
    for (int c = 0; c < 2 * NCP; ++c) acc[i][c] = _mm512_setzero_ps();
  for (int64_t kt = 0; kt < tiles; ++kt) {
    const __m512i* av = a_pairs + 2 * MR * (kt % 8);
#pragma GCC unroll 8
    for (int cc = 0; cc < NCP; ++cc) {
      const __m512i x = _mm512_loadu_si512(words + 128 * (kt % 16) + 16 * cc);
      __m512i wv[4];
#pragma GCC unroll 4
      for (int e = 0; e < 4; ++e)
        wv[e] = lookup_k<kTop>(x, e, t0[2 * cc + (e >> 1)], t1[2 * cc + (e >> 1)]);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512bh a0 = (__m512bh)_mm512_loadu_si512(av + 2 * i);
        const __m512bh a1 = (__m512bh)_mm512_loadu_si512(av + 2 * i + 1);
        acc[i][2 * cc] = _mm512_dpbf16_ps(acc[i][2 * cc], a0, (__m512bh)wv[0]);
        acc[i][2 * cc + 1] = _mm512_dpbf16_ps(acc[i][2 * cc + 1], a0, (__m512bh)wv[2]);
        acc[i][2 * cc] = _mm512_dpbf16_ps(acc[i][2 * cc], a1, (__m512bh)wv[1]);
        acc[i][2 * cc + 1] = _mm512_dpbf16_ps(acc[i][2 * cc + 1], a1, (__m512bh)wv[3]);
      }
    }
  }
  float s = 0;
  for (int i = 0; i < MR; ++i)
    for (int c = 0; c < 2 * NCP; ++c) s += _mm512_reduce_add_ps(acc[i][c]);
  return s;
}

// The fp16 decode's inner loop (pair_pass_avx512<MR, NCP, kFp16>): per line and nibble position
// the index (shift, vpternlogd), two vpermt2w (the high and low 16 bits of the fp32 weight, from
// two 64-entry tables), two vpunpck (the 16 fp32 weights of each half of the lanes), then per
// row one activation load (fp32) and two FMAs.
template <int MR, int NCP, bool kTop>
__attribute__((target("avx512f,avx512bw,avx512vbmi2"), noipa))
static float rows_loop_fp16(const int32_t* words, int64_t tiles, const __m512i* a_pairs,
                            const uint16_t* tbl) {
  __m512i h0[2 * NCP], h1[2 * NCP], l0[2 * NCP], l1[2 * NCP];
  for (int i = 0; i < 2 * NCP; ++i) {
    h0[i] = _mm512_loadu_si512(tbl + 128 * i);
    h1[i] = _mm512_loadu_si512(tbl + 128 * i + 32);
    l0[i] = _mm512_loadu_si512(tbl + 128 * i + 64);
    l1[i] = _mm512_loadu_si512(tbl + 128 * i + 96);
  }
  __m512 acc[MR][2 * NCP][2];
  for (int i = 0; i < MR; ++i)
    for (int c = 0; c < 2 * NCP; ++c) acc[i][c][0] = acc[i][c][1] = _mm512_setzero_ps();
  for (int64_t kt = 0; kt < tiles; ++kt) {
    const __m512i* av = a_pairs + 2 * MR * (kt % 8);
#pragma GCC unroll 8
    for (int cc = 0; cc < NCP; ++cc) {
      const __m512i x = _mm512_loadu_si512(words + 128 * (kt % 16) + 16 * cc);
#pragma GCC unroll 4
      for (int e = 0; e < 4; ++e) {
        const __m512i idx = pair_index_k<kTop>(x, e);
        const int cb = 2 * cc + (e >> 1);
        const __m512i wv = _mm512_permutex2var_epi16(h0[cb], idx, h1[cb]);
        const __m512i wl = _mm512_permutex2var_epi16(l0[cb], idx, l1[cb]);
        const __m512 u0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(wl, wv));
        const __m512 u1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(wl, wv));
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512 a = _mm512_castsi512_ps(_mm512_loadu_si512(av + 2 * i + (e & 1)));
          acc[i][cb][0] = _mm512_fmadd_ps(a, u0, acc[i][cb][0]);
          acc[i][cb][1] = _mm512_fmadd_ps(a, u1, acc[i][cb][1]);
        }
      }
    }
  }
  float s = 0;
  for (int i = 0; i < MR; ++i)
    for (int c = 0; c < 2 * NCP; ++c)
      s += _mm512_reduce_add_ps(_mm512_add_ps(acc[i][c][0], acc[i][c][1]));
  return s;
}

// Weights per ns of rows_loop (fp16: rows_loop_fp16) for `rows` rows (1, 2, 3, 4 or 8; fp16
// 1..4) with the kernel's lines per pass (pair_tiles_avx512): 128 weights per line.
double rows_weights_per_ns(int64_t rows, bool fp16) {
  std::vector<int32_t> words(16 * 128);
  for (size_t i = 0; i < words.size(); ++i) words[i] = static_cast<int32_t>(i * 2654435761u);
  std::vector<uint16_t> tbl(2048, 0x3f80);
  std::vector<__m512i> a_pairs(8 * 16, _mm512_set1_epi32(0x3f803f80));
  auto run = [&](auto loop, int64_t ncp) {
    const int64_t tiles = 40000000 / (ncp * rows);
    auto s = std::chrono::steady_clock::now();
    const float sink = loop(words.data(), tiles, a_pairs.data(), tbl.data());
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    return tiles * ncp * 128.0 / sec / 1e9 + 0.0 * sink;
  };
  // the kernel's index form: vpshldw at e = 3 at up to 3 rows where the CPU has VBMI2 and
  // W4K_CPU_VBMI2 is not 0 (pair_index_top_enabled)
  const char* env = std::getenv("W4K_CPU_VBMI2");
  const bool vbmi2 = __builtin_cpu_supports("avx512vbmi2") && !(env && std::strcmp(env, "0") == 0);
  if (fp16) {  // the kernel's lines per pass for fp16: 2 at one row, 1 at 2..4
    switch (rows) {
      case 1: return vbmi2 ? run(rows_loop_fp16<1, 2, true>, 2) : run(rows_loop_fp16<1, 2, false>, 2);
      case 2: return vbmi2 ? run(rows_loop_fp16<2, 1, true>, 1) : run(rows_loop_fp16<2, 1, false>, 1);
      case 3: return vbmi2 ? run(rows_loop_fp16<3, 1, true>, 1) : run(rows_loop_fp16<3, 1, false>, 1);
      case 4: return run(rows_loop_fp16<4, 1, false>, 1);
    }
    TORCH_CHECK(false, "rows_weights_per_ns: fp16 rows must be 1..4, got ", rows);
  }
  switch (rows) {
    case 1: return vbmi2 ? run(rows_loop<1, 4, true>, 4) : run(rows_loop<1, 4, false>, 4);
    case 2: return vbmi2 ? run(rows_loop<2, 2, true>, 2) : run(rows_loop<2, 2, false>, 2);
    case 3: return vbmi2 ? run(rows_loop<3, 2, true>, 2) : run(rows_loop<3, 2, false>, 2);
    case 4: return run(rows_loop<4, 2, false>, 2);
    case 8: return run(rows_loop<8, 1, false>, 1);
  }
  TORCH_CHECK(false, "rows_weights_per_ns: rows must be 1, 2, 3, 4 or 8, got ", rows);
}

// ---- the weight traversal of the M <= 4 decode split ---------------------------------------

// The M = 1 decode's work on one 64-byte line: per nibble position a shift, a vpternlogd, a
// vpermt2w and a vdpbf16ps (acc: four accumulators of this line's pass position).
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline))
inline void decode_line(const char* p, __m512* acc, __m512i t0, __m512i t1, __m512bh a) {
  const __m512i x = _mm512_loadu_si512(p);
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) acc[e] = _mm512_dpbf16_ps(acc[e], a, (__m512bh)lookup(x, e, t0, t1));
}

// Seconds to stream one weight of `tiles` k-tile rows of row_bytes (two threads claiming slices
// of 64 rows, all columns). block_tiles > 0: the decode split's order with blocks of that many
// rows; 0: row order; -1: a plain read (one vpternlogd per line, no decode).
__attribute__((target("avx512f,avx512bw,avx512bf16")))
double traverse_seconds(const torch::Tensor& w, int64_t tiles, int64_t row_bytes,
                        int64_t block_tiles) {
  const char* base = static_cast<const char*>(w.data_ptr());
  constexpr int64_t kSlice = 64, kChunk = 512;
  const int64_t slices = (tiles + kSlice - 1) / kSlice;
  std::atomic<int64_t> next{0};
  std::atomic<float> sink{0.0f};
  auto s = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
  {
    __m512 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
    const __m512i t = _mm512_set1_epi32(0x3f803f80);
    const __m512bh a = (__m512bh)t;
    for (int64_t sl = next.fetch_add(1); sl < slices; sl = next.fetch_add(1)) {
      const int64_t kt0 = sl * kSlice, kt1 = std::min(tiles, kt0 + kSlice);
      if (block_tiles < 0) {
        for (int64_t off = kt0 * row_bytes; off < kt1 * row_bytes; off += 64)
          acc[0] = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
              _mm512_castps_si512(acc[0]), _mm512_loadu_si512(base + off), t, 0x96));
      } else if (block_tiles == 0) {  // (row_bytes is a multiple of 512)
        for (int64_t off = kt0 * row_bytes; off < kt1 * row_bytes; off += 128) {
          decode_line(base + off, acc, t, t, a);
          decode_line(base + off + 64, acc + 4, t, t, a);
        }
      } else {
        for (int64_t b0 = kt0; b0 < kt1; b0 += block_tiles) {
          const int64_t b1 = std::min(kt1, b0 + block_tiles);
          for (int64_t ch = 0; ch < row_bytes; ch += kChunk)
            for (int pass = 0; pass < 2; ++pass)
              for (int64_t kt = b0; kt < b1; ++kt) {
                const char* p = base + kt * row_bytes + ch;
                if (pass == 0 && kt + block_tiles < tiles)
                  for (int l = 0; l < 8; ++l)
                    _mm_prefetch(p + block_tiles * row_bytes + 64 * l, _MM_HINT_T1);
#pragma GCC unroll 4
                for (int l = 0; l < 4; ++l)
                  decode_line(p + 64 * (4 * pass + l), acc + 4 * (l & 1), t, t, a);
              }
        }
      }
    }
    float x = 0;
    for (int i = 0; i < 8; ++i) x += _mm512_reduce_add_ps(acc[i]);
    sink.fetch_add(x);
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
  return sec + 0.0 * sink.load();
}

// A candidate decode for M = 1 that keeps the accumulators, not the tables, in registers: all 8
// lines of a chunk in one pass (16 accumulators, loaded and stored once per chunk and block),
// each 64-entry table split in two 32-entry halves (columns j = 0, 1 and j = 2, 3 of a lane
// group) read from memory by two masked vpermw (the same table values, so the same products and
// chains as the kernel's vpermt2w). Per chunk and group 2 KiB of tables ([line][b2][half][32]),
// per chunk 1 KiB of accumulators, both in per-thread scratch; the same tiles of the chunk 4
// further on prefetched (the kernel's target). Seconds, as traverse_seconds with blocks of
// block_tiles rows.
__attribute__((target("avx512f,avx512bw,avx512bf16")))
double traverse_mem_tables_seconds(const torch::Tensor& w, int64_t tiles, int64_t row_bytes,
                                   int64_t block_tiles) {
  const char* base = static_cast<const char*>(w.data_ptr());
  constexpr int64_t kSlice = 64, kChunk = 512, kAhead = 4;
  const int64_t slices = (tiles + kSlice - 1) / kSlice, chunks = row_bytes / kChunk;
  std::atomic<int64_t> next{0};
  std::atomic<float> sink{0.0f};
  auto s = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(2)
  {
    std::vector<__m512> acc_mem(chunks * 16);
    std::vector<uint16_t> tbl(chunks * 16 * 2 * 32, 0x3f80);
    const __m512i t = _mm512_set1_epi32(0x3f803f80);
    const __m512bh a0 = (__m512bh)t, a1 = (__m512bh)t;
    const __m512i code_mask = _mm512_set1_epi32(0x000f000f);
    const __m512i half_bit = _mm512_setr_epi32(0, 0x100010, 0, 0x100010, 0, 0x100010, 0,
        0x100010, 0, 0x100010, 0, 0x100010, 0, 0x100010, 0, 0x100010);
    const __mmask32 low_cols = 0x0F0F0F0F;  // 16-bit words of lanes with j = 0, 1
    for (int64_t sl = next.fetch_add(1); sl < slices; sl = next.fetch_add(1)) {
      const int64_t kt0 = sl * kSlice, kt1 = std::min(tiles, kt0 + kSlice);
      for (auto& v : acc_mem) v = _mm512_setzero_ps();
      for (int64_t b0 = kt0; b0 < kt1; b0 += block_tiles) {
        const int64_t b1 = std::min(kt1, b0 + block_tiles);
        for (int64_t ch = 0; ch < chunks; ++ch) {
          __m512 acc[16];
          for (int i = 0; i < 16; ++i) acc[i] = acc_mem[ch * 16 + i];
          const uint16_t* tc = tbl.data() + ch * 16 * 2 * 32;
          const bool in_block = ch + kAhead < chunks;
          const char* pf = base + (in_block ? b0 : b1) * row_bytes +
                           kChunk * (in_block ? ch + kAhead : ch + kAhead - chunks);
          for (int64_t kt = b0; kt < b1; ++kt) {
            const char* p = base + kt * row_bytes + kChunk * ch;
            if (in_block || b1 + (kt - b0) < tiles)
              for (int l = 0; l < 8; ++l)
                _mm_prefetch(pf + (kt - b0) * row_bytes + 64 * l, _MM_HINT_T1);
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) {
              const __m512i x = _mm512_loadu_si512(p + 64 * c);
#pragma GCC unroll 4
              for (int e = 0; e < 4; ++e) {
                const __m512i sh = e == 0 ? x : _mm512_srli_epi16(x, 4 * e);
                const __m512i idx = _mm512_ternarylogic_epi32(sh, code_mask, half_bit, 0xea);
                const uint16_t* tb = tc + (2 * c + (e >> 1)) * 64;
                __m512i v = _mm512_maskz_permutexvar_epi16(low_cols, idx, _mm512_loadu_si512(tb));
                v = _mm512_mask_permutexvar_epi16(v, ~low_cols, idx, _mm512_loadu_si512(tb + 32));
                acc[2 * c + (e >> 1)] =
                    _mm512_dpbf16_ps(acc[2 * c + (e >> 1)], (e & 1) ? a1 : a0, (__m512bh)v);
              }
            }
          }
          for (int i = 0; i < 16; ++i) acc_mem[ch * 16 + i] = acc[i];
        }
      }
    }
    float x = 0;
    for (auto& v : acc_mem) x += _mm512_reduce_add_ps(v);
    sink.fetch_add(x);
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
  return sec + 0.0 * sink.load();
}
"""


L3_BYTES = 64 << 20  # as bench_cpu_gemm.py: rotated copies total >= 4x this


def traversal(m, repeats=15):
    """GB/s of each traversal of Marlin-shaped weights (the three shapes of bench_cpu_gemm.py)."""
    orders = [("plain read (no decode)", -1), ("row order", 0),
              ("decode split, 8-row blocks (the kernel's)", 8), ("4-row blocks", 4),
              ("2-row blocks", 2)]
    print("weight traversal, two threads, M = 1 decode work per 64-byte line, median of "
          f"{repeats} passes over rotated copies (GB/s of int4 weight):")
    for n, k in [(4096, 4096), (11008, 4096), (4096, 11008)]:
        tiles, row_bytes = k // 16, 8 * n
        nbytes = tiles * row_bytes
        copies = [torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32)
                  for _ in range(max(2, -(-4 * L3_BYTES // nbytes)))]
        cells = []
        for name, order in orders:
            ts = [m.traverse_seconds(copies[i % len(copies)], tiles, row_bytes, order)
                  for i in range(repeats + 1)][1:]
            cells.append(f"{name} {nbytes / statistics.median(ts) / 1e9:.1f}")
        for bt in (1, 2, 4, 8):
            ts = [m.traverse_mem_tables_seconds(copies[i % len(copies)], tiles, row_bytes, bt)
                  for i in range(repeats + 1)][1:]
            cells.append(f"tables in memory, {bt}-row blocks {nbytes / statistics.median(ts) / 1e9:.1f}")
        print(f"  N={n} K={k}: " + ", ".join(cells))
    # the same candidate with its weight in cache, one thread: its compute rate
    tiles, row_bytes = 64, 8 * 4096
    w = torch.randint(-2**31, 2**31 - 1, (tiles * row_bytes // 4,), dtype=torch.int32)
    torch.set_num_threads(1)
    cells = []
    for bt in (1, 2, 8):
        t = statistics.median(m.traverse_mem_tables_seconds(w, tiles, row_bytes, bt)
                              for _ in range(repeats))
        cells.append(f"{bt}-row blocks {tiles * row_bytes / t / 1e9:.1f}")
    print("  tables in memory, weight in cache (2 MiB, one slice: one thread works): " +
          ", ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traversal", action="store_true",
                    help="also time the decode split's weight traversal (two threads)")
    args = ap.parse_args()
    flags = open("/proc/cpuinfo").read()
    need = ["avx512f", "avx512bw", "avx512_vbmi", "avx512_bf16", "avx512_vnni"]
    missing = [f for f in need if f not in flags]
    if missing:
        print(f"this CPU lacks {', '.join(missing)}: nothing to probe")
        return
    torch.set_num_threads(1)
    m = load_inline("w4k_probe_cpu_ops", cpp_sources=_SRC,
                    functions=["instruction_ns", "rows_weights_per_ns",
                               "traverse_seconds", "traverse_mem_tables_seconds"],
                    # lambdas do not take a function's target attribute: the whole probe is
                    # built for this CPU's AVX-512 set (checked above before loading it)
                    extra_cflags=["-O2", "-mavx512f", "-mavx512bw", "-mavx512vbmi",
                                  "-mavx512bf16", "-mavx512vnni", "-mfma", "-Wno-psabi",
                                  "-fopenmp"],
                    extra_ldflags=["-fopenmp"])
    rows = m.instruction_ns()
    cycle = 2 * dict(rows)["vpaddd"]  # vpaddd: two per cycle
    print(f"one thread; a cycle taken as 2 x vpaddd = {cycle:.3f} ns ({1 / cycle:.2f} GHz)")
    for name, ns in rows:
        print(f"  {name:<12} {ns:6.3f} ns  {ns / cycle:5.2f} cycles per instruction")
    w = {r: max(m.rows_weights_per_ns(r, False) for _ in range(3)) for r in (1, 2, 3, 4, 8)}
    w16 = {r: max(m.rows_weights_per_ns(r, True) for _ in range(3)) for r in (1, 2, 3, 4)}
    print(f"bare M = 1 decode loop (shift, vpternlogd, vpermt2w, vdpbf16ps per 32 weights, L1; "
          f"at M <= 3 nibbles 3 and 7 by one vpshldw where the CPU has VBMI2): "
          f"{w[1]:.1f} weights/ns = {w[1] / 2:.1f} GB/s of int4 weight per core, "
          f"{32 / w[1] / cycle:.2f} cycles per 32 weights")
    print("the same loop at M = 2 / 3 / 4 rows (the kernel's lines per pass; per line four lookups "
          "and 4 M vdpbf16ps), GB/s of int4 weight per core: "
          + " / ".join(f"{w[r] / 2:.1f}" for r in (2, 3, 4))
          + " (times the threads: what the op's instructions allow its weight stream)")
    print("the fp16 decode loop (per 32 weights two vpermt2w, two vpunpck, per row two FMAs) at "
          "M = 1 / 2 / 3 / 4, GB/s of int4 weight per core: "
          + " / ".join(f"{w16[r] / 2:.1f}" for r in (1, 2, 3, 4)))
    # the peaks: bench_cpu_gemm.py's probes (vdpbf16ps over independent chains, the AMX tiles),
    # on the one thread set above
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_cpu_gemm
    probes = bench_cpu_gemm.load_probes()
    g = w[8] * 2 * 8  # weights/ns x 2 flops x 8 rows
    line = (f"M = 8 decode mix (a line load, 4 lookups, 16 activation loads, 32 vdpbf16ps, L1): "
            f"{g:.0f} GFLOP/s per core")
    if probes:
        probes.peak_flops(1, 1_000_000)
        peak = max(probes.peak_flops(1, 20_000_000) for _ in range(3)) / 1e9
        line += f", {100 * g / peak:.0f} % of the vdpbf16ps peak ({peak:.0f} GFLOP/s)"
    print(line)
    if args.traversal:
        traversal(m)
    amx = max(probes.amx_peak_flops(2_000_000) for _ in range(3)) / 1e9 if probes else 0.0
    print(f"AMX TDPBF16PS: {amx:.0f} GFLOP/s per core" if amx else "AMX-BF16: not on this CPU/OS")


if __name__ == "__main__":
    main()
