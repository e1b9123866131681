// w4a16_gemm (vLLM gptq_marlin_gemm semantics): fp16/bf16 activations times a 4-bit Marlin
// weight on tensor cores, fp32 accumulation. Torch-free: compiled by nvcc for the GPU and by the
// host compiler against the SIMT emulator (csrc/simt), from this one source.
//
//   out[m, n] = sum_r a[m, perm[r]] * w[r, n] (+ b_bias[n]),
//   w[r, n]   = T((q[r, n] - z) * s),  s = b_scales[g(r), n],  z = 8 or b_zeros[g(r), n],
//   g(r)      = g_idx[r] (act-order, sorted) or r / group_size.
// The weight is rounded once to T before the mma, as the reference does; products are summed in
// fp32, the bias is added in fp32 and the output rounded once.
//
// Operand layouts (K = size_k, N = size_n; see python/w4kernels/reference.py):
//   b_q_weight uint32 [K/16, 2N]: the 128 words 128*c .. 128*c+127 of row kt hold the 16x64
//     block (k-tile kt, 64-column chunk c); word 4*i + j (lane i, 16-column n-tile j) holds
//     nibble p = q[16*kt + 2*(i%4) + dk[p], 64*c + 16*j + i/4 + dn[p]],
//     dk = [0, 8, 0, 8, 1, 9, 1, 9], dn = [0, 0, 8, 8, 0, 0, 8, 8]. Nibbles p and p+4 are the
//     two k rows of one mma B register: (p=0) b[0] and (p=1) b[1] of columns +0..7, (p=2) b[0]
//     and (p=3) b[1] of columns +8..15. Bits 0-3|16-19 are p = 0, bits 4-7|20-23 p = 1, and the
//     same after `>> 8` for p = 2, 3: two masks and one shift decode a word (fp16).
//   b_scales [G, N]: per 64 columns, position 8*(c%8) + c/8 holds column c (G > 1), or per 32
//     columns, position 8*((c%8)/2) + 2*(c/8) + c%2 holds column c (G == 1, per-channel).
//     For lane i (column c = 16j + 8h + i/4 of the chunk, e = 2j + h) that is 8*(i/4) + e, or
//     32*(e/4) + 8*(i/8) + 2*(e%4) + (i/4)%2.
//   b_zeros uint32 [G, N/8]: column c of chunk k is nibble e/2 + 4*(e%2) of word 8*k + c%8
//     (e = c/8): lane i reads one word for all its eight columns.
//
// Kernel shape. A block is 256 threads (8 warps) and owns a kRows x 128 output tile (kRows = 16,
// 32, 48 or 64: kMBlocks m16 blocks) over a contiguous run of K. K is walked in stages of 128
// rows; each stage (A tile, eight 1 KiB Marlin B k-tiles, the stage's scales, zero points or
// g_idx) is fetched with cp.async, kStages = 4 stages in flight, one barrier per stage. Warp w
// computes columns 64 * (w % 2) .. +63 (one Marlin chunk: its lane's 4 words of a k-tile are
// one 16-byte shared load) for k-tiles 2 * (w / 2) and 2 * (w / 2) + 1 of every stage: 16 mma
// per m16 block per stage and warp. At the end the four k-warps of each column half add their
// fp32 sums in shared memory (tree).
// Why these numbers: 256 threads and a 128-column tile give each warp a full Marlin chunk (no
// shuffles to assemble B fragments) and two k-tiles per barrier, which halves the per-stage
// overhead per mma against one; 4 x 128-row stages keep 32 KiB of weights in flight per block
// (enough to cover DRAM latency with one or two blocks per SM at M <= 16); 64 rows x 64 columns
// of fp32 accumulators per warp (128 registers) is the most that fits 255 registers with the
// dequantization constants, the same limit as Marlin's 64-row tile.
//
// Scales (template ScaleMode):
//   kChannel: G == 1; the lane's scales and zero constants are loaded once, before the loop.
//   kGroup, kGroupZp (with zero points): group_size 32, 64 or 128 (vLLM Marlin's sizes; every
//             32-row slot of a stage lies in one group); each stage carries the scale (and
//             zero-point) rows of its four 32-row slots, whose source advances by a constant
//             per stage (no division in the loop).
//   kRow:     act-order g_idx, or any other group size (the binding then passes
//             g_idx = r / group_size: correct for every size, slower than the paths above); each stage carries its 128 g_idx entries and a lane
//             reloads its scales from global memory (L2) when one of its rows changes group.
//             Out-of-range g_idx entries are clamped to [0, G) (the CUDA binding cannot read
//             g_idx without a device sync; the CPU and SIMT bindings reject them).
//             Act-order whose K / G is 32, 64 or 128 first checks, in the gather kernel,
//             whether every row r is in group r / (K / G); a GPTQ desc_act layer's g_idx, once
//             sorted, always is, and then the kRow kernel runs the kGroup / kGroupZp path: an
//             act-order layer costs what a group-ordered one does, and any other g_idx (a
//             row-parallel shard's, say) still gets the row-group path. The host cannot read
//             g_idx without a sync, so the choice is made per launch, on the GPU.
//
// Split-K, without any block waiting for another, balanced over the SMs (stream-K's partition):
// when the tiles alone would leave SMs idle or unevenly loaded (224 tiles on 132 SMs: some SMs
// run two tiles, some one), the (tile, stage) units, tile-major, are cut into B equal contiguous
// runs, one per block (w4a16::choose_split_blocks picks B from the SM count and the occupancy
// API, by a rule measured on an H200). A run covers the end of one tile, whole tiles, the start
// of another; the block runs one pipeline per tile it touches (a segment). A segment that covers
// its whole tile writes the output; the others write their fp32 partial tile to c_tmp and bump
// the tile's arrival counter in the workspace, and the block that arrives last (sees parts - 1)
// adds all partial tiles in block order (so the bits do not depend on which block ran when),
// adds the bias, writes the output and resets the counter to 0. The workspace must be zero on
// first use and is left zero.
//
// Act-order: a first kernel gathers A's columns through perm (8 columns per thread, 16-byte
// stores; out-of-range perm entries give zero columns).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda_compat.cuh"
#include "kernels/mma_dtype.cuh"
#include "kernels/ptx.cuh"

namespace w4k {
namespace w4a16 {

constexpr int kThreads = 256;          // 8 warps: 2 column halves x 4 k-warps
constexpr int kTileN = 128;            // output columns per block: two Marlin chunks
constexpr int kStageK = 128;           // K rows per pipeline stage: 8 k-tiles of 16
constexpr int kStageKTiles = kStageK / 16;
// Pipeline depth (cp.async groups in flight + the one being computed) of the 16-row tile and of
// the taller ones. W4K_W4A16_STAGES_16ROW overrides the first at build time, for measuring
// (benchmarks/gpu/bench_w4a16_kernel.cu).
#ifndef W4K_W4A16_STAGES_16ROW
#define W4K_W4A16_STAGES_16ROW 4
#endif
constexpr int kStages16Row = W4K_W4A16_STAGES_16ROW;
constexpr int kStagesTall = 4;
static_assert(kStages16Row >= 3 && kStages16Row <= 8, "a 16-row pipeline of 3..8 stages");
// W4K_W4A16_B_LAG: see gemm_tile's copies (off: 0).
#ifndef W4K_W4A16_B_LAG
#define W4K_W4A16_B_LAG 0
#endif
// Blocks per SM the 16-row kernels (but the row-group one, 152 registers) are compiled for: 2
// caps them at 128 registers. W4K_W4A16_MIN_BLOCKS_16ROW overrides it, for measuring.
#ifndef W4K_W4A16_MIN_BLOCKS_16ROW
#define W4K_W4A16_MIN_BLOCKS_16ROW 2
#endif
constexpr int kKWarps = 4;             // warps along K; each takes 2 k-tiles of a stage
constexpr int kBKTileBytes = 1024;     // one k-tile of the block: 2 chunks x 128 words
constexpr int kARowBytes = kStageK * 2;
constexpr int kMinStagesPerSplit = 4;  // a split shorter than the pipeline would not fill it
constexpr int kNever = 1 << 30;        // a row threshold no k_left reaches (K < 2^30)

enum class ScaleMode { kChannel, kGroup, kGroupZp, kRow };

// Bytes of one pipeline stage: A rows, the 8 B k-tiles, scales (4 slots x 128 columns), zero
// points (4 slots x 16 words), g_idx (128 rows).
template <int kMBlocks>
struct StageLayout {
  static constexpr int kRows = 16 * kMBlocks;
  static constexpr int kABytes = kRows * kARowBytes;
  static constexpr int kBOffset = kABytes;
  static constexpr int kSOffset = kBOffset + kStageKTiles * kBKTileBytes;
  static constexpr int kZOffset = kSOffset + kKWarps * kTileN * 2;
  static constexpr int kGOffset = kZOffset + kKWarps * (kTileN / 8) * 4;
  static constexpr int kBytes = kGOffset + kStageK * 4;
  static constexpr int kStages = kMBlocks == 1 ? kStages16Row : kStagesTall;
  static constexpr int kSmemBytes = kStages * kBytes;
  // Final reduction: 4 slots (2 column halves x 2 writers) of one warp's accumulators.
  static constexpr int kFragFloats = kMBlocks * 8 * 4;
  static_assert(4 * kFragFloats * 32 * 4 <= kSmemBytes, "reduction slots must fit");
  // One block's fp32 partial tile in c_tmp (fragment order, see the split-K epilogue).
  static constexpr int kTileFloats = kRows * kTileN;
};

// A tile: row r, 16-byte chunk c (k = 8c .. 8c+7) at chunk c ^ (r % 8), so the 8 rows one
// ldmatrix matrix reads hit 8 different bank groups.
__device__ __forceinline__ int a_sh_offset(int r, int c) {
  return r * kARowBytes + 16 * (c ^ (r % 8));
}

using mma::Dtype;
using mma::as_bits;
using mma::bits_as;

// Both halves = the low (high) half of x. Written with the pair intrinsics so that nvcc can fold
// the broadcast into the .H0_H0 / .H1_H1 operand selector of the HADD2/HFMA2/HMUL2 using it.
template <typename T>
__device__ __forceinline__ uint32_t broadcast_lo(uint32_t x);
template <typename T>
__device__ __forceinline__ uint32_t broadcast_hi(uint32_t x);
template <>
__device__ __forceinline__ uint32_t broadcast_lo<half>(uint32_t x) {
  return as_bits(__low2half2(bits_as<half2>(x)));
}
template <>
__device__ __forceinline__ uint32_t broadcast_hi<half>(uint32_t x) {
  return as_bits(__high2half2(bits_as<half2>(x)));
}
template <>
__device__ __forceinline__ uint32_t broadcast_lo<__nv_bfloat16>(uint32_t x) {
  return as_bits(__low2bfloat162(bits_as<__nv_bfloat162>(x)));
}
template <>
__device__ __forceinline__ uint32_t broadcast_hi<__nv_bfloat16>(uint32_t x) {
  return as_bits(__high2bfloat162(bits_as<__nv_bfloat162>(x)));
}

// Per-dtype decoding of one Marlin word into the 4 B registers of a lane (columns e0 = 2j: regs
// 0, 1; e1 = 2j + 1: regs 2, 3) as (q - z), exact. zl/zh: the per-column constants made by
// make_zero_consts.
template <typename T>
struct Decode;

template <>
struct Decode<half> {
  // Nibble at bits 0-3 | 16-19: OR into half2(1024) gives 1024 + q; minus (1024 + z) is q - z.
  // Nibble at bits 4-7 | 20-23: gives 1024 + 16 q; fma(x, 1/16, -(64 + z)) is q - z (exact: every
  // intermediate is an integer or a multiple of 1/16 below 2048).
  static constexpr uint32_t kLoMagic = 0x64006400u;
  static constexpr int kZeroHiShift = 4;
  __device__ __forceinline__ static uint32_t zero_lo(uint32_t z) { return 0x6400u | z; }
  __device__ __forceinline__ static uint32_t zero_hi(uint32_t z) { return 0xD400u | (z << 4); }
  __device__ __forceinline__ static void decode(uint32_t q, uint32_t zl0, uint32_t zh0,
                                                uint32_t zl1, uint32_t zh1, uint32_t r[4]) {
    const half2 sixteenth = bits_as<half2>(0x2C002C00u);  // 1/16
    const uint32_t q1 = q >> 8;
    r[0] = as_bits(__hsub2(bits_as<half2>(ptx::lop3<0xEA>(q, 0x000f000fu, kLoMagic)),
                           bits_as<half2>(zl0)));
    r[1] = as_bits(__hfma2(bits_as<half2>(ptx::lop3<0xEA>(q, 0x00f000f0u, kLoMagic)), sixteenth,
                           bits_as<half2>(zh0)));
    r[2] = as_bits(__hsub2(bits_as<half2>(ptx::lop3<0xEA>(q1, 0x000f000fu, kLoMagic)),
                           bits_as<half2>(zl1)));
    r[3] = as_bits(__hfma2(bits_as<half2>(ptx::lop3<0xEA>(q1, 0x00f000f0u, kLoMagic)), sixteenth,
                           bits_as<half2>(zh1)));
  }
};

template <>
struct Decode<__nv_bfloat16> {
  // bf16 has 7 mantissa bits: a nibble at bits 4-7 would reach the exponent, so every register
  // takes its nibbles at bits 0-3 | 16-19 after a shift: 128 + q, minus (128 + z).
  static constexpr uint32_t kLoMagic = 0x43004300u;
  static constexpr int kZeroHiShift = 0;
  __device__ __forceinline__ static uint32_t zero_lo(uint32_t z) { return 0x4300u | z; }
  __device__ __forceinline__ static uint32_t zero_hi(uint32_t z) { return 0x4300u | z; }
  __device__ __forceinline__ static void decode(uint32_t q, uint32_t zl0, uint32_t zh0,
                                                uint32_t zl1, uint32_t zh1, uint32_t r[4]) {
    using B2 = __nv_bfloat162;
    r[0] = as_bits(__hsub2(bits_as<B2>(ptx::lop3<0xEA>(q, 0x000f000fu, kLoMagic)),
                           bits_as<B2>(zl0)));
    r[1] = as_bits(__hsub2(bits_as<B2>(ptx::lop3<0xEA>(q >> 4, 0x000f000fu, kLoMagic)),
                           bits_as<B2>(zh0)));
    r[2] = as_bits(__hsub2(bits_as<B2>(ptx::lop3<0xEA>(q >> 8, 0x000f000fu, kLoMagic)),
                           bits_as<B2>(zl1)));
    r[3] = as_bits(__hsub2(bits_as<B2>(ptx::lop3<0xEA>(q >> 12, 0x000f000fu, kLoMagic)),
                           bits_as<B2>(zh1)));
  }
};

// The zero constants of a lane's 8 columns from its zero-point word (both halves the same
// column): zl[e] = pair(zero_lo(z_e)), zh[e] = pair(zero_hi(z_e)), z_e = nibble e/2 + 4 (e%2).
template <typename T>
__device__ __forceinline__ void make_zero_consts(uint32_t zw, uint32_t zl[8], uint32_t zh[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // Nibbles j (column 2j) and j + 4 (column 2j + 1) land in the low and high halves.
    const uint32_t z2 = (zw >> (4 * j)) & 0x000f000fu;
    const uint32_t lo = (Decode<T>::zero_lo(0) * 0x10001u) | z2;
    const uint32_t hi = (Decode<T>::zero_hi(0) * 0x10001u) | z2 << Decode<T>::kZeroHiShift;
    zl[2 * j] = broadcast_lo<T>(lo);
    zl[2 * j + 1] = broadcast_hi<T>(lo);
    zh[2 * j] = broadcast_lo<T>(hi);
    zh[2 * j + 1] = broadcast_hi<T>(hi);
  }
}

// A lane's four Marlin words of one k-tile (one 16-byte load: n-tiles j = 0..3 of its chunk),
// decoded to the B registers of its 8 columns: f(e, b0, b1) for column e = 2j + h, b0 holding
// rows 2t (low half) and 2t+1, b1 rows 2t+8 and 2t+9, as (q - z), or T((q - z) * s) with
// kScaled (scale[e][0] / [1]: the scales of b0's / b1's rows). Shared by the GEMM's main loop
// and the dense path's dequantization, so both see the same bits.
template <typename T, bool kScaled, typename F>
__device__ __forceinline__ void for_each_b_fragment(const int4 words, const uint32_t zl[8],
                                                    const uint32_t zh[8],
                                                    const uint32_t scale[8][2], F&& f) {
  using T2 = typename Dtype<T>::T2;
  const uint32_t w4[4] = {uint32_t(words.x), uint32_t(words.y), uint32_t(words.z),
                          uint32_t(words.w)};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t r[4];
    Decode<T>::decode(w4[j], zl[2 * j], zh[2 * j], zl[2 * j + 1], zh[2 * j + 1], r);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 2 * j + h;
      uint32_t b0 = r[2 * h], b1 = r[2 * h + 1];
      if constexpr (kScaled) {
        b0 = as_bits(__hmul2(bits_as<T2>(b0), bits_as<T2>(scale[e][0])));
        b1 = as_bits(__hmul2(bits_as<T2>(b1), bits_as<T2>(scale[e][1])));
      }
      f(e, b0, b1);
    }
  }
}

struct GemmParams {
  const void* a;  // [M, K] in T, row stride lda elements (lda % 8 == 0)
  int64_t lda;
  const uint32_t* b_q_weight;  // [K/16, 2N] Marlin
  const uint16_t* b_scales;    // [G, N] in T (bit patterns), Marlin-permuted, 16-byte aligned
  const uint32_t* b_zeros;     // [G, N/8] Marlin zero points, or nullptr (z = 8)
  const int32_t* g_idx;        // [K] group of each row (kRow), else nullptr
  // Act-order whose group size K / G is 32, 64 or 128 (kRow): one flag per block of the
  // gather kernel, nonzero where a row r of the block has g_idx[r] != r / group_size; all zero:
  // the rows are in group order and the kernel takes the per-stage group path. Else nullptr.
  const int* row_group_flags;
  int num_row_group_flags;
  const void* b_bias;          // [N] in T, or nullptr
  void* c;                     // [M, N] in T
  int size_m, size_n, size_k;  // M < 2^31, N <= 2^26, K < 2^30 (checked by the bindings)
  int num_groups;              // G
  int group_size;              // rows per group (kGroup)
  // The blocks' work (see "Split-K" above). split_blocks == 0: block (x, y) computes tile
  // y * n_tiles + x over all of K. Else gridDim.x = split_blocks blocks share the `units` =
  // tiles x stages (tile-major) in equal contiguous runs (split_run_begin).
  int n_tiles;
  int split_blocks;
  int64_t units;
  float* c_tmp;                // [2 * split_blocks, kTileFloats] fp32 partial tiles (split-K)
  int* counters;               // [tiles] arrival counters, zero on entry, zero on exit
  // 16 rows of a in bytes (16 * lda * sizeof(T)), formed on the host: the 64-row kernel reads
  // it from the constant bank, where ptxas re-derived 16 * lda every stage (no register left).
  int64_t a_rows16_bytes;
};

// p + bytes (a copy source moved by a byte stride).
template <typename T>
__device__ __forceinline__ const T* byte_offset(const T* ptr, int64_t bytes) {
  return reinterpret_cast<const T*>(reinterpret_cast<const char*>(ptr) + bytes);
}

// kRow: (re)loads the lane's scales and zero constants for the groups g4 of its rows 2t, 2t+1
// (B register 0) and 2t+8, 2t+9 (register 1) from global memory, the groups clamped to [0, G).
// The two halves of a register may belong to two groups: prmt pairs halfword e of one row's
// scales with halfword e of the other's. G > 1 here (G == 1 runs kChannel).
template <typename T>
__device__ __forceinline__ void load_row_scales(const GemmParams& p, const int g4[4],
                                                int row_group[4], int chunk, int col_lane,
                                                uint32_t scale[8][2], uint32_t zl[8],
                                                uint32_t zh[8]) {
  int64_t g[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    row_group[i] = g4[i];
    g[i] = min(max(g4[i], 0), p.num_groups - 1);
  }
#pragma unroll
  for (int rp = 0; rp < 2; ++rp) {
    // The lane's 8 scales of a group row are 16 contiguous bytes (see the b_scales layout).
    const int64_t col = 64 * chunk + 8 * col_lane;
    const int4 s_a = *reinterpret_cast<const int4*>(p.b_scales + g[2 * rp] * p.size_n + col);
    const int4 s_b = *reinterpret_cast<const int4*>(p.b_scales + g[2 * rp + 1] * p.size_n + col);
    const uint32_t a[4] = {uint32_t(s_a.x), uint32_t(s_a.y), uint32_t(s_a.z), uint32_t(s_a.w)};
    const uint32_t b[4] = {uint32_t(s_b.x), uint32_t(s_b.y), uint32_t(s_b.z), uint32_t(s_b.w)};
#pragma unroll
    for (int e = 0; e < 8; ++e) scale[e][rp] = ptx::prmt(a[e / 2], b[e / 2], e % 2 ? 0x7632u : 0x5410u);
  }
  if (p.b_zeros == nullptr) return;
  uint32_t zw[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) zw[i] = p.b_zeros[g[i] * (p.size_n / 8) + chunk * 8 + col_lane];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int shift = 4 * (e / 2 + 4 * (e % 2));
    const uint32_t z[4] = {(zw[0] >> shift) & 15u, (zw[1] >> shift) & 15u,
                           (zw[2] >> shift) & 15u, (zw[3] >> shift) & 15u};
    zl[e] = Decode<T>::zero_lo(z[0]) | Decode<T>::zero_lo(z[1]) << 16;
    zh[e] = Decode<T>::zero_hi(z[2]) | Decode<T>::zero_hi(z[3]) << 16;
  }
}

// Block-wide barrier (bar.sync 0 over all threads, what __syncthreads compiles to). The host
// compiler may tail-duplicate a __syncthreads call that follows a warp-dependent branch, and the
// emulator tells barrier call sites apart, so the kernel uses the named-barrier wrapper.
__device__ __forceinline__ void block_sync() { ptx::barrier_sync(0, kThreads); }

// The output stores of a tile whose fp32 sums acc this lane holds (lane of the warp with
// Marlin chunk `chunk`, tile rows from m0): y = acc (* per-channel scale) + bias, rounded once.
template <typename T, int kMBlocks, ScaleMode kMode>
__device__ __forceinline__ void store_tile(const GemmParams& p,
                                           const float (&acc)[kMBlocks][8][4], const int lane,
                                           const int chunk, const int m0) {
  using D = Dtype<T>;
  using T2 = typename D::T2;
  // Output: c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1] of each 16x8 tile.
  const T* bias = static_cast<const T*>(p.b_bias);
  T* out = static_cast<T*>(p.c);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int col = 64 * chunk + 8 * e + 2 * (lane % 4);
    float bias_lo = 0.f, bias_hi = 0.f, scale_lo = 1.f, scale_hi = 1.f;
    if (bias != nullptr) {
      bias_lo = D::to_float(bias[col]);
      bias_hi = D::to_float(bias[col + 1]);
    }
    if constexpr (kMode == ScaleMode::kChannel) {
      // Columns col, col + 1 (even) are adjacent in the per-channel scale permutation.
      const int c = col % 32;
      const int pos = 32 * (col / 32) + 8 * ((c % 8) / 2) + 2 * (c / 8);
      const uint32_t s2 = *reinterpret_cast<const uint32_t*>(p.b_scales + pos);
      scale_lo = D::to_float(bits_as<T>(static_cast<uint16_t>(s2 & 0xffffu)));
      scale_hi = D::to_float(bits_as<T>(static_cast<uint16_t>(s2 >> 16)));
    }
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
      for (int half_row = 0; half_row < 2; ++half_row) {
        const int row = m0 + 16 * mb + lane / 4 + 8 * half_row;
        if (row < p.size_m) {
          // y = acc * s + bias in fp32, two roundings (no fma), as the reference (s = 1: exact).
          const float lo = __fadd_rn(__fmul_rn(acc[mb][e][2 * half_row], scale_lo), bias_lo);
          const float hi = __fadd_rn(__fmul_rn(acc[mb][e][2 * half_row + 1], scale_hi), bias_hi);
          *reinterpret_cast<T2*>(out + static_cast<int64_t>(row) * p.size_n + col) =
              D::pack(lo, hi);
        }
      }
    }
  }
}

// Split-K partition: block b of `blocks` takes the units [begin(b), begin(b + 1)) of the
// `units` (tile, stage) pairs, tile-major: the end of one tile, whole tiles, the start of
// another. Every block gets the same number of stages to within one, whatever the tile count.
__host__ __device__ inline int64_t split_run_begin(int64_t b, int64_t units, int64_t blocks) {
  return b * units / blocks;
}
// The block whose run holds unit x: the largest b with split_run_begin(b) <= x.
__host__ __device__ inline int64_t split_run_block(int64_t x, int64_t units, int64_t blocks) {
  return ((x + 1) * blocks + units - 1) / units - 1;
}

// One block's share of one output tile: stages [stage_begin, stage_end) of tile
// m_blk * n_tiles + n_blk (split-K: `tile`). parts: how many blocks add to the tile (1: this
// block writes the output); with parts > 1 the tile's blocks are first_block, first_block + 1,
// ..., and block b keeps the partial tile of the first tile of its run in c_tmp slot 2b, of its
// last in 2b + 1: first_slot is first_block's slot for this tile, the others' is 2b.
struct Segment {
  int index;  // 0, 1, ...: the index-th tile of this block's work; -1: the work is done
  int tile;
  int n_blk, m_blk;
  int stage_begin, stage_end;
  int parts;
  int first_block, first_slot;
  bool first_of_run;  // the first tile of this block's run
};

// A copy of the segment in shared memory made with volatile loads: the compiler may not reuse
// values it loaded before the main loop (it kept them in registers, spilled, on sm_80).
__device__ __forceinline__ Segment read_segment(const Segment& sh) {
  const volatile Segment& v = sh;
  Segment seg;
  seg.index = v.index;
  seg.tile = v.tile;
  seg.n_blk = v.n_blk;
  seg.m_blk = v.m_blk;
  seg.stage_begin = v.stage_begin;
  seg.stage_end = v.stage_end;
  seg.parts = v.parts;
  seg.first_block = v.first_block;
  seg.first_slot = v.first_slot;
  seg.first_of_run = v.first_of_run;
  return seg;
}

// A split-K block's run, made once per block (64-bit divisions) and kept in shared memory, so
// that a segment's indices cost a few shared loads where they are needed and no registers across
// the main loop (the 48- and 64-row kernels have none to spare). Index 0: the run's first tile,
// 1: its last (the same tile when the run lies in one). Split-K tiles and blocks are < 2^20
// (kMaxSplitTiles) and < 2^31.
struct SplitRun {
  int first_tile, last_tile;
  int stage_begin, stage_end;  // in the first / the last tile
  int parts[2], first_block[2], first_slot[2];
};

__device__ __forceinline__ void make_split_run(const GemmParams& p, SplitRun* run) {
  const int total_stages = (p.size_k + kStageK - 1) / kStageK;
  const int64_t b = blockIdx.x;
  const int64_t u_begin = split_run_begin(b, p.units, p.split_blocks);
  const int64_t u_end = split_run_begin(b + 1, p.units, p.split_blocks);
  const int64_t tiles[2] = {u_begin / total_stages, (u_end - 1) / total_stages};
  run->first_tile = static_cast<int>(tiles[0]);
  run->last_tile = static_cast<int>(tiles[1]);
  run->stage_begin = static_cast<int>(u_begin - tiles[0] * total_stages);
  run->stage_end = static_cast<int>(u_end - tiles[1] * total_stages);
  for (int k = 0; k < 2; ++k) {
    const int64_t tile_u = tiles[k] * total_stages;
    const int64_t first = split_run_block(tile_u, p.units, p.split_blocks);
    const int64_t last = split_run_block(tile_u + total_stages - 1, p.units, p.split_blocks);
    run->parts[k] = static_cast<int>(last - first + 1);
    run->first_block[k] = static_cast<int>(first);
    // The first block's run began in an earlier tile unless it begins at this tile's start.
    run->first_slot[k] = static_cast<int>(
        2 * first + (split_run_begin(first, p.units, p.split_blocks) == tile_u ? 0 : 1));
  }
}

// Segment i (0, 1, ...) of this block's work: its share of the i-th tile its units touch
// (index -1 past the last).
__device__ __forceinline__ Segment make_segment(const GemmParams& p, const SplitRun& run,
                                                int i) {
  const int total_stages = (p.size_k + kStageK - 1) / kStageK;
  Segment seg;
  const int count = p.split_blocks == 0 ? 1 : run.last_tile - run.first_tile + 1;
  seg.index = i < count ? i : -1;
  seg.first_of_run = i == 0;
  if (p.split_blocks == 0) {
    seg.tile = 0;  // (no counters, no partial tiles)
    seg.n_blk = blockIdx.x;
    seg.m_blk = blockIdx.y;
    seg.stage_begin = 0;
    seg.stage_end = total_stages;
    seg.parts = 1;
    seg.first_block = seg.first_slot = 0;
    return seg;
  }
  seg.tile = run.first_tile + i;
  seg.n_blk = seg.tile % p.n_tiles;
  seg.m_blk = seg.tile / p.n_tiles;
  const bool last = seg.tile == run.last_tile;
  seg.stage_begin = i == 0 ? run.stage_begin : 0;
  seg.stage_end = last ? run.stage_end : total_stages;
  const int k = i == 0 ? 0 : 1;  // a middle tile (neither) has one part: this block
  seg.parts = i == 0 || last ? run.parts[k] : 1;
  seg.first_block = run.first_block[k];
  seg.first_slot = run.first_slot[k];
  return seg;
}

// The end of a block's tile: the four k-warps' sums added up, split-K, bias, scales (per
// channel) and the output stores, for the block's segment seg.
// seg_sh: the segment in shared memory. It and the thread index are read afresh here (volatile),
// so that nothing derived from them before the main loop stays live across it.
template <typename T, int kMBlocks, ScaleMode kMode>
__device__ __forceinline__ void finish_tile(const GemmParams& p, float (&acc)[kMBlocks][8][4],
                                            const Segment& seg_sh) {
  const Segment seg = read_segment(seg_sh);
  const int t = ptx::thread_index_x();
  using L = StageLayout<kMBlocks>;
  W4K_EXTERN_SHARED(int4, sh);
  char* const smem = reinterpret_cast<char*>(sh);
  __shared__ int sh_last_split;
  const int warp = t / 32, lane = t % 32;
  const int warp_n = warp % 2, warp_k = warp / 2;
  const int m0 = seg.m_blk * L::kRows;
  const int num_chunks = p.size_n / 64;
  const int chunk = 2 * seg.n_blk + warp_n;

  // Tree reduction over the four k-warps of each column half: k-warps 2, 3 -> 0, 1, then
  // 1 -> 0. Slot layout [slot][fragment float][lane] (conflict-free).
  float* red = reinterpret_cast<float*>(smem);
  auto exchange = [&](bool writer, bool reader, int slot_w, int slot_r) {
    if (writer) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int e = 0; e < 8; ++e)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            red[(slot_w * L::kFragFloats + (mb * 8 + e) * 4 + i) * 32 + lane] = acc[mb][e][i];
    }
    block_sync();
    if (reader) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int e = 0; e < 8; ++e)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc[mb][e][i] += red[(slot_r * L::kFragFloats + (mb * 8 + e) * 4 + i) * 32 + lane];
    }
    block_sync();
  };
  exchange(warp_k >= 2, warp_k < 2, 2 * warp_n + warp_k - 2, 2 * warp_n + warp_k);
  exchange(warp_k == 1, warp_k == 0, 2 * warp_n, 2 * warp_n);
  const bool holds_sum = warp_k == 0 && chunk < num_chunks;

  if (seg.parts > 1) {
    // Split-K: write this block's partial tile (fragment order: lane-contiguous float4s), then
    // count arrivals; the last to arrive adds the partial tiles in block order.
    auto frag_offset = [&](int mb, int e) {
      return ((warp_n * kMBlocks + mb) * 8 + e) * 128 + 4 * lane;
    };
    if (holds_sum) {
      const int64_t slot = 2 * static_cast<int64_t>(blockIdx.x) + (seg.first_of_run ? 0 : 1);
      float* part = p.c_tmp + slot * L::kTileFloats;
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          *reinterpret_cast<float4*>(part + frag_offset(mb, e)) =
              make_float4(acc[mb][e][0], acc[mb][e][1], acc[mb][e][2], acc[mb][e][3]);
    }
    __threadfence();  // the partial tile is visible GPU-wide before the arrival is
    block_sync();
    if (t == 0) {
      const int arrived = atomicAdd(p.counters + seg.tile, 1);
      const bool last = arrived == seg.parts - 1;
      if (last) p.counters[seg.tile] = 0;  // every part has arrived: ready for the next launch
      sh_last_split = last;
    }
    block_sync();
    if (!sh_last_split) return;
    __threadfence();  // the other splits' partial tiles are read after their arrivals
    if (holds_sum) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int e = 0; e < 8; ++e)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mb][e][i] = 0.f;
      // Part j of the tile is block first_block + j's, in its slot first_slot (j = 0) or
      // 2 (first_block + j) (its run begins in this tile).
      for (int j = 0; j < seg.parts; ++j) {
        const int slot = j == 0 ? seg.first_slot : 2 * (seg.first_block + j);
        const float* part = p.c_tmp + static_cast<int64_t>(slot) * L::kTileFloats;
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(part + frag_offset(mb, e)));
            acc[mb][e][0] += v.x;
            acc[mb][e][1] += v.y;
            acc[mb][e][2] += v.z;
            acc[mb][e][3] += v.w;
          }
      }
    }
  }
  if (!holds_sum) return;
  store_tile<T, kMBlocks, kMode>(p, acc, lane, chunk, m0);
}

// One block's share of one output tile, the segment seg in shared memory (the kernel below, for
// one scale path).
template <typename T, int kMBlocks, ScaleMode kMode>
__device__ __forceinline__ void gemm_tile(const GemmParams& p, const Segment& seg) {
  using L = StageLayout<kMBlocks>;
  using D = Dtype<T>;
  W4K_EXTERN_SHARED(int4, sh);
  char* const smem = reinterpret_cast<char*>(sh);

  // A volatile read of %tid.x: nothing derived from the thread index is hoisted out of the
  // segment loop (gemm_block), where it would stay live through the epilogue.
  const int t = ptx::thread_index_x(), warp = t / 32, lane = t % 32;
  const int warp_n = warp % 2;  // column half: Marlin chunk 2 * seg.n_blk + warp_n
  const int warp_k = warp / 2;  // k-tiles 2 * warp_k, 2 * warp_k + 1 of each stage
  const int n_blk = seg.n_blk;
  const int m0 = seg.m_blk * L::kRows;
  const int num_chunks = p.size_n / 64;
  const int stage_begin = seg.stage_begin;
  const int num_stages = seg.stage_end - stage_begin;
  constexpr bool kGrouped = kMode == ScaleMode::kGroup || kMode == ScaleMode::kGroupZp;
  const bool has_zp = p.b_zeros != nullptr;  // kGroupZp: always
  const uint64_t evict_first = ptx::createpolicy_evict_first();  // weights are read once

  // ---- Per-thread copy assignments, computed once; the loop advances them by constants. ----
  // A: thread t copies 16-byte chunk t % 16 (k = 8 * (t % 16) ..) of rows t / 16 + 16 i.
  const int a_gl_rd_col = 8 * (t % 16);
  const T* a_gl_rd = static_cast<const T*>(p.a) + static_cast<int64_t>(m0 + t / 16) * p.lda +
                     stage_begin * kStageK + a_gl_rd_col;
  // Rows t / 16 + 16 i. At 64 rows the byte stride from the constant bank (GemmParams::
  // a_rows16_bytes) took 1.91 -> 1.84 non-HMMA per HMMA (fp16 per channel, sm_80); at 32 and 48
  // rows it cost 0.06-0.1, so there the stride is formed from lda as before.
  const int64_t a_gl_rd_delta_i = 16 * p.lda;
  auto a_row_block = [&](const T* rd, int i) {
    return kMBlocks == 4 ? byte_offset(rd, i * p.a_rows16_bytes) : rd + i * a_gl_rd_delta_i;
  };
  const int a_sh_wr = a_sh_offset(t / 16, t % 16);
  int a_col_threshold[kMBlocks];  // a copy is valid while its k < k_left (kNever: row past M)
#pragma unroll
  for (int i = 0; i < kMBlocks; ++i)
    a_col_threshold[i] = m0 + t / 16 + 16 * i < p.size_m ? a_gl_rd_col : kNever;
  // B: thread t copies 16-byte chunks t % 32 (Marlin chunk 2 n_blk) and t % 32 + 32 (chunk
  // 2 n_blk + 1, which may be past N) of k-tile t / 32: one pointer, the second copy 512 bytes on.
  const int b_gl_stride = 2 * p.size_n;  // words per Marlin row (k-tile)
  const int b_gl_rd_delta_stage = kStageKTiles * b_gl_stride;
  const int b_kt_row = 16 * (t / 32);  // first K row of the copied k-tile within the stage
  const int b_kt_row_chunk1 = 2 * n_blk + 1 < num_chunks ? b_kt_row : kNever;
  const uint32_t* b_gl_rd = p.b_q_weight +
                            static_cast<int64_t>(stage_begin * kStageKTiles + t / 32) * b_gl_stride +
                            n_blk * 256 + 4 * (t % 32);
  const ptx::HintDst b_sh_wr =
      ptx::hint_dst(smem + L::kBOffset + (t / 32) * kBKTileBytes + 16 * (t % 32));
  // Rows of K left from the stage being fetched on: the copies' bounds (a partial last stage
  // is zero-filled) are one compare of a thread constant against it.
  int k_left = p.size_k - stage_begin * kStageK;
  // Scales / zero points (kGroup*): a stage holds groups_per_stage = 128 / group_size (1, 2
  // or 4) group rows, slot u the group of its rows u * group_size .., each copied once: threads
  // 0 .. 16 * groups_per_stage - 1 copy 16 bytes (8 columns) of slot t / 16's scale row, threads
  // 64 .. 64 + 4 * groups_per_stage - 1 16 bytes (32 columns) of slot (t - 64) / 4's zero-point
  // row; the other threads up to 63 (79) zero-fill a slot nobody reads. (Until 2026-11-28 every
  // 32-row quarter had its own slot, so group 128 copied its row four times: Nsight Compute
  // counted those copies for most of the kernel's excess global sectors (19 % of all) and shared
  // wavefronts (45 %).) group_size is 32, 64 or 128, so the group advances by groups_per_stage
  // rows every stage: the source pointer moves by a constant, nothing is divided in the loop.
  const int groups_per_stage = kGrouped ? kStageK / p.group_size : 0;
  const bool s_copier = t < 64, z_copier = kMode == ScaleMode::kGroupZp && t >= 64 && t < 80;
  const int s_slot = s_copier ? t / 16 : (t - 64) / 4;
  const int s_col = s_copier ? 8 * (t % 16) : 32 * ((t - 64) % 4);  // first column copied
  const bool s_col_valid = 2 * n_blk + s_col / 64 < num_chunks;
  const int s_sh_wr = s_copier ? L::kSOffset + s_slot * kTileN * 2 + 2 * s_col
                               : L::kZOffset + s_slot * (kTileN / 8) * 4 + s_col / 2;
  // Copies past K, of a second chunk past N, of a slot past the stage's groups, or by threads
  // that copy nothing: their row threshold is never below k_left (one compare per copy and
  // stage; a copy that fails it reads nothing and zero-fills).
  const int s_row_threshold = (s_copier || z_copier) && s_col_valid && s_slot < groups_per_stage
                                  ? s_slot * p.group_size
                                  : kNever;
  const int s_gl_rd_delta = z_copier ? p.size_n / 8 : p.size_n / 2;  // words per group row
  const int64_t s_gl_rd_delta_stage = int64_t{groups_per_stage} * s_gl_rd_delta;
  const uint32_t* s_gl_rd = nullptr;  // this thread's scale or zero-point source
  // Where the lane's scales (8 columns, 16 bytes) and zero-point word lie in a stage: in the
  // slot of the warp's k-tiles (rows 32 warp_k .. + 31 of the stage).
  const int s_rd_slot = kGrouped ? 32 * warp_k / p.group_size : 0;
  const int s_sh_rd = L::kSOffset + s_rd_slot * kTileN * 2 + warp_n * 128 + 16 * (lane / 4);
  const int z_sh_rd = L::kZOffset + s_rd_slot * (kTileN / 8) * 4 + 4 * (8 * warp_n + lane / 4);
  if constexpr (kGrouped) {
    const int64_t group = static_cast<int64_t>(stage_begin) * groups_per_stage + s_slot;  // once
    s_gl_rd = z_copier ? p.b_zeros + group * s_gl_rd_delta + n_blk * 16 + s_col / 8
                       : reinterpret_cast<const uint32_t*>(p.b_scales) + group * s_gl_rd_delta +
                             (n_blk * kTileN + s_col) / 2;
  }
  // g_idx (kRow): threads 128..159 copy 4 entries each.
  const bool g_copier = kMode == ScaleMode::kRow && t >= 128 && t < 160;
  int g_row = stage_begin * kStageK + 4 * (t - 128);

  // ---- Per-lane constants of the compute: its 8 columns' scales and zero constants. ----
  const int chunk = 2 * n_blk + warp_n;  // this warp's Marlin chunk (may be >= num_chunks)
  const int col_lane = lane / 4;
  uint32_t scale[8][2];  // per column e: rows (2t, 2t+1) and (2t+8, 2t+9) of the k-tile
  uint32_t zl[8], zh[8];
  {
    make_zero_consts<T>(0x88888888u, zl, zh);  // symmetric: every zero point is 8
  }
  if constexpr (kMode == ScaleMode::kChannel) {
    // Per-channel: the B registers hold (q - z) and the scale multiplies the fp32 sum in the
    // epilogue (vLLM's Marlin order), so only the zero constants are per lane.
    if (has_zp && chunk < num_chunks) make_zero_consts<T>(p.b_zeros[chunk * 8 + col_lane], zl, zh);
  }
  int row_group[4] = {-1, -1, -1, -1};  // kRow: groups of the lane's 4 rows, cached scales

  float acc[kMBlocks][8][4];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mb][e][i] = 0.f;

  // Issues the copies of the next stage into shared offset `st` (one commit group per call, an
  // empty one past the split's end, so "L::kStages - 2 groups pending" means "stage i landed").
  // Rows past K, M or N are zero-filled, so a partial last stage needs no special compute.
  // Up to 48 rows the A source pointer lags the fetched stage by `ahead` stages (a constant in
  // the unrolled loops below, so that the copies' sources are a pointer plus an immediate) and
  // moves on once per pass over the slots (advance): 1-2 instructions per stage fewer. At 64
  // rows (255 registers) it moves on every stage, which ptxas schedules better there.
  // W4K_W4A16_B_LAG=1 (up to 48 rows): the B source lags the same way, by a run-time stride,
  // so that a copy's address register is not overwritten just after the copy. An LDGSTS reads
  // its address registers late, and the add that moves the pointer on after each stage's copies
  // waits for it: Nsight Compute put 7% of the 16-row kernel's stall samples on that one add
  // (H200, 2026-11-28). The lag costs 1-2 % more instructions (614 -> 623 per 4 stages at 16
  // rows, group 128), and ptxas then gives the freed address register to a shared load 3-6
  // instructions on, which may wait the same way: not yet timed on a GPU, so off by default.
  constexpr int kALag = kMBlocks < 4 ? 1 : 0;
  constexpr bool kBLag = W4K_W4A16_B_LAG && kMBlocks < 4;
  auto advance = [&](int stages) {
    a_gl_rd += kALag * stages * kStageK;
    if constexpr (kBLag) b_gl_rd += static_cast<int64_t>(stages) * b_gl_rd_delta_stage;
  };
  int stages_left = num_stages;
  auto fetch = [&](int st, int ahead) {
    if (stages_left > 0) {
      char* s = smem + st;
      if constexpr (kGrouped) {
        if (s_copier || z_copier)
          ptx::cp_async16_cg_zfill(s + s_sh_wr, s_gl_rd, s_row_threshold < k_left);
        s_gl_rd += s_gl_rd_delta_stage;
      }
#pragma unroll
      for (int i = 0; i < kMBlocks; ++i) {
        ptx::cp_async16_cg_zfill(s + a_sh_wr + i * 16 * kARowBytes,
                                 a_row_block(a_gl_rd + kALag * ahead * kStageK, i),
                                 a_col_threshold[i] < k_left);
      }
      const uint32_t* b_src =
          kBLag ? b_gl_rd + static_cast<int64_t>(ahead) * b_gl_rd_delta_stage : b_gl_rd;
      ptx::cp_async16_cg_zfill_hint(b_sh_wr + st, b_src, b_kt_row < k_left, evict_first);
      ptx::cp_async16_cg_zfill_hint(b_sh_wr + st + 512, b_src + 128, b_kt_row_chunk1 < k_left,
                                    evict_first);
      if constexpr (kMode == ScaleMode::kRow) {
        if (g_copier) {
          ptx::cp_async16_cg_zfill(s + L::kGOffset + 16 * (t - 128), p.g_idx + g_row,
                                   4 * (t - 128) < k_left);
        }
        g_row += kStageK;
      }
      if (!kALag) a_gl_rd += kStageK;
      if (!kBLag) b_gl_rd += b_gl_rd_delta_stage;
      k_left -= kStageK;
      --stages_left;
    }
    ptx::cp_async_commit_group();
  };

  // Stage i sits in slot i % L::kStages; the loop is unrolled over the slots so that every shared
  // offset is a constant.
  auto compute = [&](const char* st) {
    if constexpr (kGrouped) {
      // The lane's 8 scales of its slot: 16 contiguous bytes (see the b_scales layout).
      const int4 s4 = *reinterpret_cast<const int4*>(st + s_sh_rd);
      const uint32_t sw[4] = {uint32_t(s4.x), uint32_t(s4.y), uint32_t(s4.z), uint32_t(s4.w)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        scale[2 * j][0] = scale[2 * j][1] = broadcast_lo<T>(sw[j]);
        scale[2 * j + 1][0] = scale[2 * j + 1][1] = broadcast_hi<T>(sw[j]);
      }
      if constexpr (kMode == ScaleMode::kGroupZp) {
        const uint32_t zw = *reinterpret_cast<const uint32_t*>(st + z_sh_rd);
        make_zero_consts<T>(zw, zl, zh);
      }
    }

#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int kt = 2 * warp_k + kk;  // k-tile within the stage
      if constexpr (kMode == ScaleMode::kRow) {
        // Groups of the lane's rows 2t, 2t+1, 2t+8, 2t+9 of the k-tile.
        const int32_t* g_sh =
            reinterpret_cast<const int32_t*>(st + L::kGOffset) + 16 * kt + 2 * (lane % 4);
        const int2 g01 = *reinterpret_cast<const int2*>(g_sh);
        const int2 g89 = *reinterpret_cast<const int2*>(g_sh + 8);
        const int g4[4] = {g01.x, g01.y, g89.x, g89.y};
        // (A warp whose chunk lies past N computes on zeros and stores nothing: no reload.)
        if ((g4[0] != row_group[0] || g4[1] != row_group[1] || g4[2] != row_group[2] ||
             g4[3] != row_group[3]) &&
            chunk < num_chunks) {
          load_row_scales<T>(p, g4, row_group, chunk, col_lane, scale, zl, zh);
        }
      }
      uint32_t frag_a[kMBlocks][4];
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        ptx::ldmatrix_x4(frag_a[mb], st + a_sh_offset(16 * mb + lane % 16, 2 * kt + lane / 16));
      }
      const int4 words = *reinterpret_cast<const int4*>(st + L::kBOffset + kt * kBKTileBytes +
                                                        warp_n * 512 + 16 * lane);
      // Per-channel: (q - z) only; the scale multiplies the fp32 sum in the epilogue.
      for_each_b_fragment<T, kMode != ScaleMode::kChannel>(
          words, zl, zh, scale, [&](int e, uint32_t b0, uint32_t b1) {
            const uint32_t frag_b[2] = {b0, b1};
#pragma unroll
            for (int mb = 0; mb < kMBlocks; ++mb) D::mma(frag_a[mb], frag_b, acc[mb][e]);
          });
    }
  };
#pragma unroll
  for (int u = 0; u < L::kStages - 1; ++u) fetch(u * L::kBytes, u);
  advance(L::kStages - 1);
  for (int i0 = 0; i0 < num_stages; i0 += L::kStages) {
#pragma unroll
    for (int u = 0; u < L::kStages; ++u) {
      if (i0 + u >= num_stages) break;
      ptx::cp_async_wait_group<L::kStages - 2>();
      // Stage i0 + u is visible to all, and everyone is done with the slot the fetch reuses.
      block_sync();
      fetch(((u + L::kStages - 1) % L::kStages) * L::kBytes, u);
      compute(smem + u * L::kBytes);
    }
    advance(L::kStages);
  }
  ptx::cp_async_wait_all();
  block_sync();  // the pipeline memory becomes the reduction buffer
  finish_tile<T, kMBlocks, kMode>(p, acc, seg);
}

// A block's whole work: its tile (no split-K), or its run of the split-K partition, one
// segment per tile it touches (a pipeline each; at most the first and last are partial).
template <typename T, int kMBlocks, ScaleMode kMode>
__device__ __forceinline__ void gemm_block(const GemmParams& p) {
  // The run and the current segment live in shared memory, written by thread 0 between
  // barriers: the segment's indices are read where they are used, at the start and in the
  // epilogue, and hold no registers across the main loop (the 48- and 64-row kernels have none
  // to spare).
  __shared__ SplitRun run;
  __shared__ Segment seg;
  if (threadIdx.x == 0) {
    if (p.split_blocks != 0) make_split_run(p, &run);
    seg = make_segment(p, run, 0);
  }
  block_sync();
  while (true) {
    gemm_tile<T, kMBlocks, kMode>(p, seg);
    block_sync();  // every thread is done with seg (and the reduction with shared memory)
    if (threadIdx.x == 0) seg = make_segment(p, run, seg.index + 1);
    block_sync();
    if (seg.index < 0) break;
  }
}

// Act-order with a group size the per-stage path takes: whether every row r is in group
// r / group_size (g_idx sorted with equal groups, as GPTQ's desc_act writes it once vLLM's
// marlin_sort_g_idx has sorted it), read off the gather kernel's flags. Block-uniform.
__device__ __forceinline__ bool rows_in_group_order(const GemmParams& p) {
  int out_of_order = 0;
  for (int i = threadIdx.x; i < p.num_row_group_flags; i += kThreads)
    out_of_order |= p.row_group_flags[i];
  return !__syncthreads_or(out_of_order);
}

// Grid: (N / 128 rounded up, ceil(M / kRows)), or (split blocks) with split-K; kThreads
// threads, kSmemBytes of dynamic shared memory. kRow with act-order flags runs the per-stage
// group path when the rows turn out to be in group order (decided per launch on the GPU, where
// the host cannot read g_idx without a sync): the act-order layers of GPTQ checkpoints then
// cost what group-ordered ones do.
template <int kMBlocks, ScaleMode kMode>
constexpr int kMinBlocksPerSm =
    kMBlocks == 1 && kMode != ScaleMode::kRow ? W4K_W4A16_MIN_BLOCKS_16ROW : 1;

template <typename T, int kMBlocks, ScaleMode kMode>
__global__ void __launch_bounds__(kThreads, (kMinBlocksPerSm<kMBlocks, kMode>))
    w4a16_gemm_kernel(const GemmParams p) {
  if constexpr (kMode == ScaleMode::kRow) {
    if (p.row_group_flags != nullptr && rows_in_group_order(p)) {
      if (p.b_zeros != nullptr)
        gemm_block<T, kMBlocks, ScaleMode::kGroupZp>(p);
      else
        gemm_block<T, kMBlocks, ScaleMode::kGroup>(p);
      return;
    }
  }
  gemm_block<T, kMBlocks, kMode>(p);
}

// Act-order: a_perm[m, r] = a[m, perm[r]]. Grid (ceil(K / (8 * kThreads)), min(M, 65535)): a
// thread gathers 8 columns of rows blockIdx.y, + gridDim.y, ... and writes each row's as one
// 16-byte store (K % 16 == 0). An out-of-range perm entry gives
// a zero column instead of an out-of-bounds read (the CPU and SIMT bindings reject it; the CUDA
// binding cannot read perm without a device sync). With row_group_flags (see GemmParams), the
// blocks of row 0 also check their rows' g_idx against r / group_size (a power of two:
// 1 << group_shift) and write one flag per block, so no flag needs zeroing first.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    permute_cols_kernel(const T* __restrict__ a, int64_t lda, const int32_t* __restrict__ perm,
                        T* __restrict__ a_perm, int size_k, int size_m,
                        const int32_t* __restrict__ g_idx, int group_shift,
                        int* __restrict__ row_group_flags) {
  const int r0 = 8 * (blockIdx.x * kThreads + threadIdx.x);
  if (row_group_flags != nullptr && blockIdx.y == 0) {
    // Threads past K check the last 8 rows again (a select, not a branch: no thread-dependent
    // branch may precede the block-wide vote).
    const int rg = r0 < size_k ? r0 : size_k - 8;
    const int4 g0 = *reinterpret_cast<const int4*>(g_idx + rg);
    const int4 g1 = *reinterpret_cast<const int4*>(g_idx + rg + 4);
    const int g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    int out_of_order = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) out_of_order |= g[i] != (rg + i) >> group_shift;
    out_of_order = __syncthreads_or(out_of_order);
    if (threadIdx.x == 0) row_group_flags[blockIdx.x] = out_of_order;
  }
  if (r0 >= size_k) return;
  const int4 p0 = *reinterpret_cast<const int4*>(perm + r0);
  const int4 p1 = *reinterpret_cast<const int4*>(perm + r0 + 4);
  int src[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
  uint32_t keep = 0;  // bit i: perm[r0 + i] is in range (else the column reads as zero)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    keep |= uint32_t(src[i] >= 0 && src[i] < size_k) << i;
    src[i] = keep >> i & 1 ? src[i] : 0;
  }
  for (int64_t m = blockIdx.y; m < size_m; m += gridDim.y) {
    const uint16_t* a_row = reinterpret_cast<const uint16_t*>(a) + m * lda;
    uint16_t v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = keep >> i & 1 ? a_row[src[i]] : uint16_t(0);
    int4 out;
    out.x = int(v[0] | uint32_t(v[1]) << 16);
    out.y = int(v[2] | uint32_t(v[3]) << 16);
    out.z = int(v[4] | uint32_t(v[5]) << 16);
    out.w = int(v[6] | uint32_t(v[7]) << 16);
    *reinterpret_cast<int4*>(a_perm + m * size_k + r0) = out;
  }
}

// Many-token path (plan.dense): the weight dequantized once into a dense row-major [K, N]
// tensor in T, rows in Marlin order (act-order: perm's order), w[r, n] = T((q - z) * s) by the
// decode and scale multiply of the GEMM's B fragments, so the same bits as the tensor-core path
// multiplies with (and as reference.marlin_dequantize); the binding then runs a dense matmul on
// a (or a[:, perm]). Grid (K / 16, ceil(N / 512)), kThreads threads: warp w decodes k-tile
// blockIdx.x of Marlin chunk 8 * blockIdx.y + w (its lane's 16 bytes, as the GEMM's warps read
// them), places the 16 x 64 values in shared memory and writes the 16 rows with 16-byte stores.
// (K / 16 < 2^26 fits grid x; the planner keeps N / 512 within grid y's 65535.)
// Groups come from g_idx (clamped to [0, G), as the GEMM's row-group path) or r / group_size.
template <typename T>
__global__ void __launch_bounds__(kThreads) marlin_dequant_kernel(const GemmParams p, T* w) {
  __shared__ int4 tile_sh[kThreads / 32][16 * 64 * 2 / 16];  // per warp: 16 rows x 64 columns
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int chunk = 8 * blockIdx.y + warp, kt = blockIdx.x;
  if (chunk >= p.size_n / 64) return;  // warp-uniform; only warp barriers follow
  const int col_lane = lane / 4, row_lane = 2 * (lane % 4);
  int g4[4];  // groups of the lane's rows 2t, 2t+1, 2t+8, 2t+9 of the k-tile
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = 16 * kt + row_lane + (i % 2) + 8 * (i / 2);
    g4[i] = p.g_idx != nullptr ? p.g_idx[r] : r / p.group_size;
  }
  uint32_t scale[8][2], zl[8], zh[8];
  int row_group[4];
  make_zero_consts<T>(0x88888888u, zl, zh);  // symmetric unless b_zeros is given
  load_row_scales<T>(p, g4, row_group, chunk, col_lane, scale, zl, zh);
  const int4 words = *reinterpret_cast<const int4*>(
      p.b_q_weight + static_cast<int64_t>(kt) * 2 * p.size_n + chunk * 128 + 4 * lane);
  uint16_t* tile = reinterpret_cast<uint16_t*>(tile_sh[warp]);
  for_each_b_fragment<T, true>(words, zl, zh, scale, [&](int e, uint32_t b0, uint32_t b1) {
    const int col = 8 * e + col_lane;
    tile[row_lane * 64 + col] = static_cast<uint16_t>(b0 & 0xffffu);
    tile[(row_lane + 1) * 64 + col] = static_cast<uint16_t>(b0 >> 16);
    tile[(row_lane + 8) * 64 + col] = static_cast<uint16_t>(b1 & 0xffffu);
    tile[(row_lane + 9) * 64 + col] = static_cast<uint16_t>(b1 >> 16);
  });
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int v = lane + 32 * i, row = v / 8, c16 = v % 8;  // 16 rows x 8 16-byte pieces
    *reinterpret_cast<int4*>(w + static_cast<int64_t>(16 * kt + row) * p.size_n + 64 * chunk +
                             8 * c16) = tile_sh[warp][8 * row + c16];
  }
}

// Rows of M per block: Marlin's m_blocks, 16 * (1..4).
inline int tile_m_blocks(int64_t size_m) {
  return size_m <= 16 ? 1 : size_m <= 32 ? 2 : size_m <= 48 ? 3 : 4;
}

// Opts the kernel in to its dynamic shared memory (> 48 KiB) and returns how many of its blocks
// one SM holds. On the GPU both are per device and fixed, so they are computed once per device
// (first call; a race between two host threads only repeats the same work); the emulator's
// limits come from the environment, so it asks every time.
template <typename T, int kMBlocks, ScaleMode kMode>
cudaError_t kernel_attributes(int* blocks_per_sm) {
  auto* kernel = &w4a16_gemm_kernel<T, kMBlocks, kMode>;
  const int smem = StageLayout<kMBlocks>::kSmemBytes;
  auto query = [&](int* out) {
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, kernel, kThreads, smem);
    return err;
  };
#if W4K_SIMT
  int blocks = 0;
  const cudaError_t err = query(&blocks);
#else
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};  // 0: not queried yet on that device (one per kernel)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int blocks = device < kMaxDevices ? cached[device] : 0;
  if (blocks == 0) {
    err = query(&blocks);
    if (err == cudaSuccess && device < kMaxDevices) cached[device] = blocks;
  }
#endif
  if (blocks_per_sm != nullptr) *blocks_per_sm = blocks;
  return err;
}

template <typename T, int kMBlocks, ScaleMode kMode>
cudaError_t launch_tile(const GemmParams& p, dim3 grid, cudaStream_t stream) {
  cudaError_t err = kernel_attributes<T, kMBlocks, kMode>(nullptr);
  if (err != cudaSuccess) return err;
  auto* kernel = &w4a16_gemm_kernel<T, kMBlocks, kMode>;
  W4K_LAUNCH(kernel, grid, dim3(kThreads), StageLayout<kMBlocks>::kSmemBytes, stream, p);
  return cudaGetLastError();
}

// Calls f(std::integral_constant<int, kMBlocks>, std::integral_constant<ScaleMode, kMode>) for
// the run-time configuration.
template <typename F>
cudaError_t dispatch_config(int m_blocks, ScaleMode mode, F&& f) {
  auto by_mode = [&](auto mb) -> cudaError_t {
    switch (mode) {
      case ScaleMode::kChannel:
        return f(mb, std::integral_constant<ScaleMode, ScaleMode::kChannel>{});
      case ScaleMode::kGroup:
        return f(mb, std::integral_constant<ScaleMode, ScaleMode::kGroup>{});
      case ScaleMode::kGroupZp:
        return f(mb, std::integral_constant<ScaleMode, ScaleMode::kGroupZp>{});
      default:
        return f(mb, std::integral_constant<ScaleMode, ScaleMode::kRow>{});
    }
  };
  switch (m_blocks) {
    case 1:
      return by_mode(std::integral_constant<int, 1>{});
    case 2:
      return by_mode(std::integral_constant<int, 2>{});
    case 3:
      return by_mode(std::integral_constant<int, 3>{});
    default:
      return by_mode(std::integral_constant<int, 4>{});
  }
}

}  // namespace w4a16

// How a w4a16_gemm call runs: tile configuration, scale mode and split-K. Made by
// w4a16_gemm_plan (host), consumed by launch_w4a16_gemm; the binding allocates c_tmp_floats
// floats of split-K scratch when split_blocks > 0.
struct W4a16Plan {
  int m_blocks = 1;  // rows per tile / 16
  w4a16::ScaleMode mode = w4a16::ScaleMode::kChannel;  // kRow without act-order: the binding
                                                       // passes g_idx = r / group_size
  int64_t m_tiles = 0, n_tiles = 0, total_stages = 0;
  // 0: one block per tile, over all of K. Else split-K: this many blocks share the tiles'
  // stages in equal runs (GemmParams, split_run_begin).
  int64_t split_blocks = 0;
  int64_t c_tmp_floats = 0;
  // Many tokens, grouped scales: dequantize once (marlin_dequant_kernel) into a dense [K, N]
  // weight that the binding multiplies with a matmul (launch_w4a16_gemm then runs only the
  // act-order gather and the dequantization).
  bool dense = false;
  // kRow for act-order with K % G == 0 and K / G in {32, 64, 128}: the launch checks g_idx on
  // the GPU and the kernel takes the per-stage group path when the rows are in group order; the
  // binding passes row_group_flags_count() ints of scratch.
  bool check_row_groups = false;
  int64_t row_group_flags_count(int64_t size_k) const {
    return check_row_groups ? (size_k + 8 * w4a16::kThreads - 1) / (8 * w4a16::kThreads) : 0;
  }
};

namespace w4a16 {

// Split-K is planned only up to this many tiles (the partition's 64-bit arithmetic, and far
// past where the tiles alone fill a GPU).
constexpr int64_t kMaxSplitTiles = int64_t{1} << 20;
// At most this many split-K blocks (their c_tmp slots, 2 per block, are counted in int).
constexpr int64_t kMaxSplitBlocks = (int64_t{1} << 30) - 1;

// The split-K blocks for a problem (0: no split), the rule measured on an H200 (fp16, group 128,
// CUDA graphs, M = 1..128 on 4096 x 4096, 4096 x 11008, 11008 x 4096, 8192 x 28672, against no
// split and 1, 2 and 4 balanced blocks per SM; README "Measured on an H200"):
// * fewer tiles than resident blocks: every tile cut into the same number of runs, as many as
//   fill the resident slots (each run >= kMinStagesPerSplit stages), or only one block per SM
//   when that already covers 3/4 of the SMs. Runs then end on tile boundaries: one pipeline per
//   block. This was the fastest of all at M <= 16 (4096 x 11008: 258 blocks 0.0148 ms, 264
//   balanced ones crossing tiles 0.0172, no split 0.0162) and wherever it splits at M = 64-128.
// * at least as many tiles as resident blocks, the last wave short by over 5 %: one balanced
//   run per resident block (a run crosses tiles: two or three pipelines). 4096 x 11008 at
//   M = 128 (172 tiles of 64 rows, 132 resident): 0.0547 ms against 0.0651 for two waves of
//   tiles; 8192 x 28672 at M = 64 / 128: 1.07x / 1.13x.
// Anything else: no split (whole waves of tiles).
inline int64_t choose_split_blocks(int64_t tiles, int64_t stages, int64_t num_sms,
                                   int64_t blocks_per_sm) {
  const int64_t resident = blocks_per_sm * num_sms;
  if (tiles < resident) {
    int64_t splits = resident / tiles;
    const int64_t one_per_sm = num_sms / tiles;
    if (one_per_sm >= 1 && 4 * tiles * one_per_sm >= 3 * num_sms)
      splits = std::min(splits, one_per_sm);
    splits = std::min(splits, stages / kMinStagesPerSplit);
    return splits > 1 ? tiles * splits : 0;
  }
  const int64_t waves = (tiles + resident - 1) / resident;
  const bool short_last_wave = 20 * waves * resident > 21 * tiles;
  return short_last_wave && tiles * stages / resident >= kMinStagesPerSplit ? resident : 0;
}

}  // namespace w4a16

// Chooses the configuration for a problem: the M tile from M (Marlin's 16/32/48/64 rows), the
// scale mode from the grouping, and split-K from the SM count and the occupancy API
// (w4a16::choose_split_blocks), when the tile counters fit the workspace (num_counters ints; 0
// disables split-K). split_blocks_override >= 0 replaces the choice (0: no split; else that
// many blocks, at most one per stage of the problem): W4K_W4A16_SPLIT_BLOCKS, for measuring.
// From dense_threshold rows of M on, grouped layers (G > 1) take the dense path instead; per
// channel keeps the kernel, which applies the scale to the fp32 sum (no fp16/bf16 weight holds
// (q - z) * s unrounded).
template <typename T>
cudaError_t w4a16_gemm_plan(int64_t size_m, int64_t size_n, int64_t size_k, int64_t num_groups,
                            bool has_act_order, bool has_zp, int num_sms, int64_t num_counters,
                            int64_t dense_threshold, W4a16Plan* plan,
                            int64_t split_blocks_override = -1) {
  using namespace w4a16;
  W4a16Plan pl;
  pl.m_blocks = tile_m_blocks(size_m);
  const int64_t group_size = size_k / num_groups;
  if (num_groups == 1) {
    pl.mode = ScaleMode::kChannel;
  } else if (!has_act_order && (group_size == 32 || group_size == 64 || group_size == 128)) {
    pl.mode = has_zp ? ScaleMode::kGroupZp : ScaleMode::kGroup;
  } else {
    pl.mode = ScaleMode::kRow;
    pl.check_row_groups = has_act_order && size_k % num_groups == 0 &&
                          (group_size == 32 || group_size == 64 || group_size == 128);
  }
  if (num_groups > 1 && size_m >= dense_threshold && (size_n / 64 + 7) / 8 <= 65535) {
    pl.dense = true;
    pl.check_row_groups = false;
    *plan = pl;
    return cudaSuccess;
  }
  pl.m_tiles = (size_m + 16 * pl.m_blocks - 1) / (16 * pl.m_blocks);
  pl.n_tiles = (size_n + kTileN - 1) / kTileN;
  pl.total_stages = (size_k + kStageK - 1) / kStageK;
  const int64_t tiles = pl.m_tiles * pl.n_tiles;
  if (tiles <= num_counters && tiles <= kMaxSplitTiles) {
    if (split_blocks_override >= 0) {
      pl.split_blocks =
          std::min({split_blocks_override, tiles * pl.total_stages, kMaxSplitBlocks});
    } else {
      int blocks_per_sm = 0;
      const cudaError_t err = dispatch_config(pl.m_blocks, pl.mode, [&](auto mb, auto mode) {
        return kernel_attributes<T, decltype(mb)::value, decltype(mode)::value>(&blocks_per_sm);
      });
      if (err != cudaSuccess) return err;
      pl.split_blocks = choose_split_blocks(tiles, pl.total_stages, std::max(num_sms, 1),
                                            std::max(blocks_per_sm, 1));
    }
  }
  if (pl.split_blocks > 0) pl.c_tmp_floats = 2 * pl.split_blocks * 16 * pl.m_blocks * kTileN;
  *plan = pl;
  return cudaSuccess;
}

// out [M, N] = a [M, K] (act-order: a[:, perm]) times the Marlin weight; see the header comment
// and ops.w4a16_gemm. T = half or __nv_bfloat16 for a, b_scales, b_bias and out.
// Preconditions (checked by the bindings): 16 <= K < 2^30, K % 16 == 0, 64 <= N <= 2^26,
// N % 64 == 0, 1 <= M < 2^31; a, b_q_weight, b_scales, g_idx and perm 16-byte aligned,
// lda % 8 == 0; g_idx given when plan.mode is kRow (without act-order: g_idx[r] = r / group_size);
// perm given only for act-order; a_perm_tmp: M * K elements of T when perm is given;
// row_group_flags_tmp: plan.row_group_flags_count(K) ints (no initial value needed); with
// plan.split_blocks > 0, c_tmp holds plan.c_tmp_floats floats and counters plan.m_tiles *
// plan.n_tiles zeroed ints (left zeroed). plan.dense: w_dense_tmp holds K * N elements of T
// (16-byte aligned); only the gather and the dequantization run (out is left to the caller).
template <typename T>
cudaError_t launch_w4a16_gemm(const W4a16Plan& plan, const T* a, int64_t lda,
                              const uint32_t* b_q_weight, const T* b_scales,
                              const uint32_t* b_zeros, const int32_t* g_idx, const int32_t* perm,
                              T* a_perm_tmp, int* row_group_flags_tmp, const T* b_bias, T* out,
                              int64_t size_m, int64_t size_n, int64_t size_k, int64_t num_groups,
                              float* c_tmp, int* counters, T* w_dense_tmp, cudaStream_t stream) {
  using namespace w4a16;
  if (size_m == 0) return cudaSuccess;
  GemmParams p{};
  p.a = a;
  p.lda = lda;
  if (perm != nullptr) {
    auto* permute = &permute_cols_kernel<T>;
    const dim3 grid(static_cast<unsigned>((size_k + 8 * kThreads - 1) / (8 * kThreads)),
                    static_cast<unsigned>(std::min<int64_t>(size_m, 65535)));
    const int group_size = static_cast<int>(size_k / num_groups);
    int* flags = plan.check_row_groups ? row_group_flags_tmp : nullptr;
    W4K_LAUNCH(permute, grid, dim3(kThreads), 0, stream, a, lda, perm, a_perm_tmp,
               static_cast<int>(size_k), static_cast<int>(size_m), g_idx,
               flags ? __builtin_ctz(group_size) : 0, flags);
    p.row_group_flags = flags;
    p.num_row_group_flags = static_cast<int>(plan.row_group_flags_count(size_k));
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    p.a = a_perm_tmp;
    p.lda = size_k;
  }
  p.b_q_weight = b_q_weight;
  p.b_scales = reinterpret_cast<const uint16_t*>(b_scales);
  p.b_zeros = b_zeros;
  p.g_idx = plan.mode == ScaleMode::kRow ? g_idx : nullptr;
  p.b_bias = b_bias;
  p.c = out;
  p.size_m = static_cast<int>(size_m);
  p.size_n = static_cast<int>(size_n);
  p.size_k = static_cast<int>(size_k);
  p.num_groups = static_cast<int>(num_groups);
  p.group_size = static_cast<int>(size_k / num_groups);
  p.n_tiles = static_cast<int>(plan.n_tiles);
  p.split_blocks = static_cast<int>(plan.split_blocks);
  p.units = plan.m_tiles * plan.n_tiles * plan.total_stages;
  p.c_tmp = c_tmp;
  p.counters = counters;
  p.a_rows16_bytes = 16 * p.lda * static_cast<int64_t>(sizeof(T));
  if (plan.dense) {
    const dim3 grid(static_cast<unsigned>(size_k / 16),
                    static_cast<unsigned>((size_n / 64 + 7) / 8));
    auto* dequant = &marlin_dequant_kernel<T>;
    W4K_LAUNCH(dequant, grid, dim3(kThreads), 0, stream, p, w_dense_tmp);
    return cudaGetLastError();
  }
  const dim3 grid = plan.split_blocks > 0
                        ? dim3(static_cast<unsigned>(plan.split_blocks))
                        : dim3(static_cast<unsigned>(plan.n_tiles),
                               static_cast<unsigned>(plan.m_tiles));
  return dispatch_config(plan.m_blocks, plan.mode, [&](auto mb, auto mode) {
    return launch_tile<T, decltype(mb)::value, decltype(mode)::value>(p, grid, stream);
  });
}

}  // namespace w4k
