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
// becomes 128 consecutive words of out row kt, starting at word 128*s. Word 4*i + j of those
// 128 (i = lane of the mma that consumes it, j = 16-column n-tile of the step; so each lane's
// four words form one 16-byte load in the GEMM) holds eight codes, nibble p (bits 4p..4p+3):
//     q[16*kt + 2*(i%4) + dk[p],  64*s + 16*j + i/4 + dn[p]]
//     dk = [0, 8, 0, 8, 1, 9, 1, 9],  dn = [0, 0, 8, 8, 0, 0, 8, 8]
// i.e. the (k, n) pairs of lane i's m16n8k16 B fragments for both 8-column halves of the
// n-tile, interleaved so that nibbles p and p+4 become the two halves of one half2 in Marlin's
// lop3 int4 -> fp16 conversion.
//
// Kernel shape (vLLM/Marlin style): a block of 4 warps owns a run of kRepackTilesPerBlock
// consecutive 16 x 64 tiles (row-major over (k-tile, 64-column step)). The source words of each
// tile are staged into shared memory with cp.async, kRepackStages tiles in flight (one commit
// group per tile; wait until the oldest has landed), then thread t builds output word t of the
// tile from shared memory: 128 consecutive words, a coalesced 512-byte store per block. With
// act-order the 16 source rows of a tile are gathered through perm: perm[16*kt .. 16*kt+15]
// picks the word row of each and is staged too, because its low 3 bits pick the nibble.
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

// Shared-memory image of one staged tile, in 32-bit words, and where column n of row r sits.
// Lane l of warp w reads, per load, rows 2*a + const (a = (l/4)%4) at columns 16*j + col
// (j = l%4, col = 2w + l/16). The layouts keep every 16-byte chunk aligned for cp.async and
// spread those reads over the banks.
template <RepackSource kSource>
struct RepackStage;

template <>
struct RepackStage<RepackSource::kGptq> {
  // 2 word rows (k = 0..7, 8..15 of the tile) x 64 columns. The row is fixed per load, so
  // only 16*j + col varies: a 4-word gap after column 31 moves j = 2, 3 off the banks of
  // j = 0, 1 (conflict-free).
  static constexpr int kRowStride = 68;
  static constexpr int kWords = 2 * kRowStride;
  __device__ __forceinline__ static int offset(int row, int n) {
    return row * kRowStride + n + 4 * (n / 32);
  }
};

template <>
struct RepackStage<RepackSource::kAwq> {
  // 16 k rows x 8 words (64 columns). A load reads word 2j (+1) of rows 2a + const: with a
  // stride of 12 words the rows start at banks 0, 24, 16, 8 (conflict-free).
  static constexpr int kRowStride = 12;
  static constexpr int kWords = 16 * kRowStride;
  __device__ __forceinline__ static int offset(int row, int word) {
    return row * kRowStride + word;
  }
};

template <>
struct RepackStage<RepackSource::kGptqActOrder> {
  // 16 gathered word rows x 64 columns, then the 16 perm entries of the tile. A load reads
  // rows 2a + const (16 (a, j) pairs, 32 addresses); no row stride separates them better than
  // 4-way, so the 16-byte chunk c of row r is stored at chunk c ^ ((r/2) % 4) (2-way, the
  // minimum: only 2 words of each chunk are read per load).
  static constexpr int kRowStride = 64;
  static constexpr int kPermOffset = 16 * kRowStride;
  static constexpr int kWords = kPermOffset + 16;
  __device__ __forceinline__ static int offset(int row, int n) {
    return row * kRowStride + 4 * ((n / 4) ^ ((row / 2) % 4)) + n % 4;
  }
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
      ptx::cp_async16_cg(stage + Stage::offset(row, col), src);
    }
  } else if constexpr (kSource == RepackSource::kAwq) {
    // Rows 16*kt ..+15, words 8*s ..+7 (columns 64*s ..+63): 16 x 32 bytes = 32 x 16 B.
    if (t < 32) {
      const int row = t / 2, word = 4 * (t % 2);
      const uint32_t* src =
          b_q_weight + (kRepackTileK * k_tile + row) * (size_n / 8) + n_step * 8 + word;
      ptx::cp_async16_cg(stage + Stage::offset(row, word), src);
    }
  } else {
    // 16 gathered rows x 64 columns = 256 x 16 B; the word row of Marlin row r is perm[r] / 8.
    // Each source word is fetched once per row it holds (8 times over the whole repack, mostly
    // from L2), as in vLLM: a word row mixes rows that perm sends to different k-tiles.
    // An out-of-range perm entry zero-fills its row instead of reading out of bounds (the CPU
    // and SIMT bindings reject it; the CUDA binding cannot read perm without a sync).
    const int32_t* tile_perm = perm + kRepackTileK * k_tile;
    for (int chunk = t; chunk < 16 * 16; chunk += kRepackThreads) {
      const int row = chunk / 16, col = 4 * (chunk % 16);
      const int32_t src_k = tile_perm[row];
      const bool valid = src_k >= 0 && src_k < size_k;
      const uint32_t* src =
          b_q_weight + (valid ? src_k / 8 : 0) * size_n + n_step * kRepackTileN + col;
      ptx::cp_async16_cg_zfill(stage + Stage::offset(row, col), src, valid);
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
    return (stage[Stage::offset(r / 8, n)] >> (4 * (r % 8))) & 15u;
  } else if constexpr (kSource == RepackSource::kAwq) {
    // Column 8w + j sits in nibble [0, 4, 1, 5, 2, 6, 3, 7][j] = j/2 + 4*(j%2) of word w.
    const int j = n % 8;
    return (stage[Stage::offset(r, n / 8)] >> (4 * (j / 2 + 4 * (j % 2)))) & 15u;
  } else {
    const uint32_t src_k = static_cast<uint32_t>(stage[Stage::kPermOffset + r]);
    return (stage[Stage::offset(r, n)] >> (4 * (src_k % 8))) & 15u;
  }
}

// Marlin word 4*lane + n_tile of the staged tile (lane 0..31 of the consuming mma, n_tile 0..3).
template <RepackSource kSource>
__device__ __forceinline__ uint32_t repack_word(const uint32_t* stage, int lane, int n_tile) {
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
// (K/16) * (N/64). Requires K % 16 == 0, N % 64 == 0, b_q_weight 16-byte aligned.
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

  int stage = 0;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    ptx::cp_async_wait_group<kRepackStages - 2>();
    // Everyone's copies of this tile have landed, and everyone is done reading the stage the
    // next fetch overwrites (the one computed in the previous iteration).
    __syncthreads();
    fetch(tile + kRepackStages - 1, (stage + kRepackStages - 1) % kRepackStages);

    const int t = threadIdx.x;
    const uint32_t word = repack_word<kSource>(sh + stage * Stage::kWords, t / 4, t % 4);
    const int64_t k_tile = tile / n_steps, n_step = tile % n_steps;
    out[k_tile * 2 * size_n + n_step * 2 * kRepackTileN + t] = word;
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
// the bindings): K % 16 == 0, N % 64 == 0, b_q_weight 16-byte aligned, out [K/16, 2N].
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
