// Repack GPTQ- or AWQ-packed 4-bit weights into the Marlin layout (vLLM gptq_marlin_repack /
// awq_marlin_repack, byte-identical). Torch-free: compiled by nvcc for the GPU and by the host
// compiler against the SIMT emulator (csrc/simt), from this one source.
//
// Notation: K = size_k, N = size_n, q[k, n] in 0..15 the logical 4-bit code.
//
// Sources:
//   GPTQ  b_q_weight uint32 [K/8, N]:  q[k, n] = (b_q_weight[k/8, n] >> 4*(k%8)) & 15
//   AWQ   b_q_weight uint32 [K, N/8]:  q[k, 8c+j] = (b_q_weight[k, c] >> 4*kAwqNibble[j]) & 15,
//                                      kAwqNibble = [0, 4, 1, 5, 2, 6, 3, 7]
//   act-order (GPTQ only): Marlin row r is GPTQ row perm[r].
//
// Marlin layout, out uint32 [K/16, 2N]. A 16 x 64 block of q (k-tile kt, 64-column step s)
// becomes 128 consecutive words of out row kt, starting at word 128*s. Word 32*j + i of those
// 128 (j = 16-column n-tile of the step, i = lane of the mma fragment that consumes it) holds
// eight codes, nibble p (bits 4p..4p+3) being
//     q[16*kt + 2*(i%4) + dk[p],  64*s + 16*j + i/4 + dn[p]]
//     dk = [0, 8, 0, 8, 1, 9, 1, 9],  dn = [0, 0, 8, 8, 0, 0, 8, 8]
// i.e. the (k, n) pairs of lane i's m16n8k16 B fragments for both 8-column halves of the
// n-tile, interleaved so that nibbles p and p+4 form the two fp16 halves of one dequantized
// half2 (Marlin's lop3 int4 -> fp16 trick).
//
// Kernel shape (vLLM/Marlin style): a block of 4 warps owns a run of kTilesPerBlock
// consecutive 16 x 64 tiles (row-major over (k-tile, 64-column step)). The source words of each
// tile are staged into shared memory with cp.async, kStages tiles in flight (commit one group
// per tile, wait until the oldest has landed), and warp j then builds the 32 output words of
// n-tile j from shared memory, one word per lane: coalesced 128-byte stores per warp. With
// act-order the 16 source rows of a tile are gathered through perm: perm[16*kt .. 16*kt+15]
// picks the word row of each and is also staged, because its low 3 bits pick the nibble.
#pragma once

#include <cstdint>

#include "kernels/cuda_compat.cuh"
#include "kernels/ptx.cuh"

namespace w4k {
namespace marlin {

enum class RepackSource {
  kGptq,          // GPTQ packing along K, rows in order
  kGptqActOrder,  // GPTQ packing along K, row r of the output is source row perm[r]
  kAwq,           // AutoAWQ packing along N
};

constexpr int kRepackTileK = 16;        // k rows per Marlin tile
constexpr int kRepackTileN = 64;        // columns per step: four 16-wide n-tiles, one per warp
constexpr int kRepackThreads = 128;     // 4 warps
constexpr int kRepackStages = 4;        // tiles in flight per block (cp.async groups)
constexpr int kRepackTilesPerBlock = 16;

// Shared-memory image of one staged tile, in 32-bit words. Row strides are padded (keeping
// every row 16-byte aligned for cp.async) so the words one warp reads fall in distinct banks.
template <RepackSource kSource>
struct RepackStage;

template <>
struct RepackStage<RepackSource::kGptq> {
  // 2 word rows (k = 0..7, 8..15 of the tile) x 64 columns. A warp reads one row at 8
  // consecutive columns (lanes sharing a column broadcast): no padding needed.
  static constexpr int kRowStride = 64;
  static constexpr int kWords = 2 * kRowStride;
};

template <>
struct RepackStage<RepackSource::kAwq> {
  // 16 k rows x 8 words (64 columns). A warp reads rows 2*(i%4) (+1, +8, +9) at one word: with
  // a stride of 12 words those 4 rows hit banks 0, 24, 16, 8 instead of 0, 16, 0, 16.
  static constexpr int kRowStride = 12;
  static constexpr int kWords = 16 * kRowStride;
};

template <>
struct RepackStage<RepackSource::kGptqActOrder> {
  // 16 gathered word rows x 64 columns, stride 68 (rows 0/2/4/6 -> bank offsets 0/8/16/24),
  // then the 16 perm entries of the tile.
  static constexpr int kRowStride = 68;
  static constexpr int kPermOffset = 16 * kRowStride;
  static constexpr int kWords = kPermOffset + 16;
};

// Issues the cp.async copies of tile `tile` into `stage` (all threads call it; each copies its
// share). The caller commits the group.
template <RepackSource kSource>
__device__ __forceinline__ void repack_fetch_tile(uint32_t* stage,
                                                  const uint32_t* __restrict__ b_q_weight,
                                                  const int32_t* __restrict__ perm,
                                                  int64_t tile, int64_t size_k, int64_t size_n) {
  using Stage = RepackStage<kSource>;
  const int64_t n_steps = size_n / kRepackTileN;
  const int64_t k_tile = tile / n_steps;
  const int64_t n_step = tile % n_steps;
  const int t = threadIdx.x;

  if constexpr (kSource == RepackSource::kGptq) {
    // Word rows 2*kt and 2*kt+1, columns 64*s ..+63: 2 x 256 contiguous bytes = 32 x 16 B.
    if (t < 32) {
      const int row = t / 16, col = 4 * (t % 16);
      const uint32_t* src = b_q_weight + (2 * k_tile + row) * size_n + n_step * kRepackTileN + col;
      ptx::cp_async16_cg(stage + row * Stage::kRowStride + col, src);
    }
  } else if constexpr (kSource == RepackSource::kAwq) {
    // Rows 16*kt ..+15, words 8*s ..+7 (columns 64*s ..+63): 16 x 32 bytes = 32 x 16 B.
    if (t < 32) {
      const int row = t / 2, word = 4 * (t % 2);
      const uint32_t* src =
          b_q_weight + (kRepackTileK * k_tile + row) * (size_n / 8) + n_step * 8 + word;
      ptx::cp_async16_cg(stage + row * Stage::kRowStride + word, src);
    }
  } else {
    // 16 gathered rows x 64 columns = 256 x 16 B; the word row of Marlin row r is perm[r] / 8.
    // An out-of-range perm entry zero-fills its row instead of reading out of bounds.
    const int32_t* tile_perm = perm + kRepackTileK * k_tile;
    for (int chunk = t; chunk < 16 * 16; chunk += kRepackThreads) {
      const int row = chunk / 16, col = 4 * (chunk % 16);
      const int32_t src_k = tile_perm[row];
      const bool valid = src_k >= 0 && src_k < size_k;
      const uint32_t* src =
          b_q_weight + (valid ? src_k / 8 : 0) * size_n + n_step * kRepackTileN + col;
      ptx::cp_async16_cg_zfill(stage + row * Stage::kRowStride + col, src, valid);
    }
    if (t < kRepackTileK) {
      ptx::cp_async4_ca(stage + Stage::kPermOffset + t, tile_perm + t);
    }
  }
}

// Code q[16*kt + r, 64*s + n] of the staged tile (r in 0..15, n in 0..63).
template <RepackSource kSource>
__device__ __forceinline__ uint32_t repack_code(const uint32_t* stage, int r, int n) {
  using Stage = RepackStage<kSource>;
  if constexpr (kSource == RepackSource::kGptq) {
    return (stage[(r / 8) * Stage::kRowStride + n] >> (4 * (r % 8))) & 15u;
  } else if constexpr (kSource == RepackSource::kAwq) {
    // Column 8w + j sits in nibble [0, 4, 1, 5, 2, 6, 3, 7][j] = j/2 + 4*(j%2) of word w.
    const int j = n % 8;
    return (stage[r * Stage::kRowStride + n / 8] >> (4 * (j / 2 + 4 * (j % 2)))) & 15u;
  } else {
    const uint32_t src_k = static_cast<uint32_t>(stage[Stage::kPermOffset + r]);
    return (stage[r * Stage::kRowStride + n] >> (4 * (src_k % 8))) & 15u;
  }
}

// The Marlin word of lane `lane` for n-tile `n_tile` (0..3) of the staged tile.
template <RepackSource kSource>
__device__ __forceinline__ uint32_t repack_word(const uint32_t* stage, int n_tile, int lane) {
  const int r0 = 2 * (lane % 4);
  const int n0 = 16 * n_tile + lane / 4, n1 = n0 + 8;
  return repack_code<kSource>(stage, r0, n0) |
         repack_code<kSource>(stage, r0 + 8, n0) << 4 |
         repack_code<kSource>(stage, r0, n1) << 8 |
         repack_code<kSource>(stage, r0 + 8, n1) << 12 |
         repack_code<kSource>(stage, r0 + 1, n0) << 16 |
         repack_code<kSource>(stage, r0 + 9, n0) << 20 |
         repack_code<kSource>(stage, r0 + 1, n1) << 24 |
         repack_code<kSource>(stage, r0 + 9, n1) << 28;
}

// Grid: ceil(num_tiles / kRepackTilesPerBlock) blocks of kRepackThreads, num_tiles =
// (K/16) * (N/64). Requires K % 16 == 0, N % 64 == 0, b_q_weight (and perm) 16-byte aligned.
template <RepackSource kSource>
__global__ void __launch_bounds__(kRepackThreads)
    marlin_repack_kernel(const uint32_t* __restrict__ b_q_weight,
                         const int32_t* __restrict__ perm,  // [K], only for kGptqActOrder
                         uint32_t* __restrict__ out,        // [K/16, 2N]
                         int64_t size_k, int64_t size_n) {
  using Stage = RepackStage<kSource>;
  // int4 elements keep every stage 16-byte aligned, as cp.async requires.
  static_assert(Stage::kWords % 4 == 0, "stage size must be a whole number of 16-byte chunks");
  __shared__ int4 sh_stages[kRepackStages * Stage::kWords / 4];
  uint32_t* sh = reinterpret_cast<uint32_t*>(sh_stages);

  const int64_t n_steps = size_n / kRepackTileN;
  const int64_t num_tiles = (size_k / kRepackTileK) * n_steps;
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * kRepackTilesPerBlock;
  const int64_t tile_end =
      tile_begin + kRepackTilesPerBlock < num_tiles ? tile_begin + kRepackTilesPerBlock
                                                    : num_tiles;

  // One commit per pipeline slot, even when the slot has nothing to fetch, so that
  // "wait until at most kRepackStages - 2 groups are pending" always means "tile i landed".
  auto fetch = [&](int64_t tile, int stage) {
    if (tile < tile_end) {
      repack_fetch_tile<kSource>(sh + stage * Stage::kWords, b_q_weight, perm, tile, size_k,
                                 size_n);
    }
    ptx::cp_async_commit_group();
  };

  for (int s = 0; s < kRepackStages - 1; ++s) fetch(tile_begin + s, s);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int stage = 0;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    ptx::cp_async_wait_group<kRepackStages - 2>();
    // Everyone's copies of this tile have landed, and everyone is done reading the stage the
    // next fetch overwrites (the one computed in the previous iteration).
    __syncthreads();
    fetch(tile + kRepackStages - 1, (stage + kRepackStages - 1) % kRepackStages);

    const uint32_t word = repack_word<kSource>(sh + stage * Stage::kWords, warp, lane);
    const int64_t k_tile = tile / n_steps, n_step = tile % n_steps;
    out[k_tile * 2 * size_n + n_step * 2 * kRepackTileN + 32 * warp + lane] = word;
    stage = (stage + 1) % kRepackStages;
  }
  ptx::cp_async_wait_all();
}

inline int64_t marlin_repack_num_blocks(int64_t size_k, int64_t size_n) {
  const int64_t num_tiles = (size_k / kRepackTileK) * (size_n / kRepackTileN);
  return (num_tiles + kRepackTilesPerBlock - 1) / kRepackTilesPerBlock;
}

}  // namespace marlin

// GPTQ [K/8, N] -> Marlin [K/16, 2N]. perm: nullptr (no act-order) or int32 [K] (Marlin row r
// takes GPTQ row perm[r]; entries outside 0..K-1 produce zero codes). Preconditions (checked by
// the bindings): K % 16 == 0, N % 64 == 0, b_q_weight and perm 16-byte aligned, out [K/16, 2N].
inline cudaError_t launch_marlin_repack(const uint32_t* b_q_weight, const int32_t* perm,
                                        uint32_t* out, int64_t size_k, int64_t size_n,
                                        cudaStream_t stream) {
  using marlin::RepackSource;
  const int64_t blocks = marlin::marlin_repack_num_blocks(size_k, size_n);
  if (blocks == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(blocks)), block(marlin::kRepackThreads);
  if (perm != nullptr) {
    W4K_LAUNCH(marlin::marlin_repack_kernel<RepackSource::kGptqActOrder>, grid, block, 0, stream,
               b_q_weight, perm, out, size_k, size_n);
  } else {
    W4K_LAUNCH(marlin::marlin_repack_kernel<RepackSource::kGptq>, grid, block, 0, stream,
               b_q_weight, perm, out, size_k, size_n);
  }
  return cudaGetLastError();
}

// AWQ [K, N/8] -> Marlin [K/16, 2N]. Same preconditions (b_q_weight 16-byte aligned).
inline cudaError_t launch_awq_marlin_repack(const uint32_t* b_q_weight, uint32_t* out,
                                            int64_t size_k, int64_t size_n,
                                            cudaStream_t stream) {
  using marlin::RepackSource;
  const int64_t blocks = marlin::marlin_repack_num_blocks(size_k, size_n);
  if (blocks == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(blocks)), block(marlin::kRepackThreads);
  const int32_t* no_perm = nullptr;
  W4K_LAUNCH(marlin::marlin_repack_kernel<RepackSource::kAwq>, grid, block, 0, stream, b_q_weight,
             no_perm, out, size_k, size_n);
  return cudaGetLastError();
}

}  // namespace w4k
