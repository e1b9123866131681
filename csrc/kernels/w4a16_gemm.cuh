// w4a16_gemm (vLLM gptq_marlin_gemm semantics): fp16/bf16 activations times a 4-bit Marlin
// weight on tensor cores, fp32 accumulation. Torch-free: compiled by nvcc for the GPU and by the
// host compiler against the SIMT emulator (csrc/simt), from this one source.
//
//   out[m, n] = sum_r a[m, perm[r]] * w[r, n] (+ b_bias[n]),
//   w[r, n]   = T((q[r, n] - z) * s),  s = b_scales[g(r), n],  z = 8 or b_zeros[g(r), n],
//   g(r)      = g_idx[r] (act-order, sorted) or r / group_size.
// The weight is rounded once to T before the mma, as Marlin (and the reference) do.
//
// Operand layouts (K = size_k, N = size_n; see python/w4kernels/reference.py):
//   b_q_weight uint32 [K/16, 2N]: the 128 words 128*c .. 128*c+127 of row kt hold the 16x64
//     block (k-tile kt, 64-column chunk c); word 4*i + j (lane i, 16-column n-tile j) holds
//     nibble p = q[16*kt + 2*(i%4) + dk[p], 64*c + 16*j + i/4 + dn[p]],
//     dk = [0, 8, 0, 8, 1, 9, 1, 9], dn = [0, 0, 8, 8, 0, 0, 8, 8]. Nibbles p and p+4 are the
//     two k rows of one mma B register: (p=0) b[0] and (p=1) b[1] of columns +0..7, (p=2) b[0]
//     and (p=3) b[1] of columns +8..15.
//   b_scales [G, N]: per 64 columns, position 8*(c%8) + c/8 holds column c (G > 1), or per 32
//     columns, position 8*((c%8)/2) + 2*(c/8) + c%2 holds column c (G == 1, per-channel).
//     For lane i (column c = 16j + 8h + i/4 of the chunk, e = 2j + h) that is 8*(i/4) + e, or
//     32*(e/4) + 8*(i/8) + 2*(e%4) + (i/4)%2.
//   b_zeros uint32 [G, N/8]: column c of chunk k is nibble AWQ_NIBBLE[e] = e/2 + 4*(e%2) of word
//     8*k + c%8 (e = c/8): lane i reads one word for all its eight columns.
//
// Kernel shape (Marlin style, split-K free): a block of 4 warps owns a (16*kMBlocks) x 64 output
// tile and walks the whole K in stages of 64 rows. Each stage (A tile, the four 512-byte Marlin
// B k-tiles, the stage's g_idx) is fetched with cp.async, kStages stages in flight. Warp w
// takes k-tile w of every stage: A fragments by ldmatrix from an XOR-swizzled tile, B
// fragments straight from its lane's 16-byte Marlin word group (lop3 int4 -> T2, minus the
// zero point, times the scale), 8 * kMBlocks mma.m16n8k16 with fp32 accumulators. The four
// warps' partial sums are added in shared memory at the end (tree), bias added, output rounded.
// Split-K (small M x N grids): blockIdx.z takes a contiguous run of stages; the splits of one
// output tile add their fp32 partial sums into c_tmp one after the other, in split order,
// serialized by a lock per tile in the workspace (ld.acquire spin / red.release), and the last
// split adds the bias, writes the output and resets the lock to 0.
// Act-order: a first kernel gathers A's columns through perm (as vLLM does); the GEMM then
// reads the sorted g_idx per row.
#pragma once

#include <cstdint>

#include "kernels/cuda_compat.cuh"
#include "kernels/mma_dtype.cuh"
#include "kernels/ptx.cuh"

namespace w4k {
namespace w4a16 {

constexpr int kThreads = 128;     // 4 warps
constexpr int kTileN = 64;        // output columns per block: one Marlin chunk
constexpr int kTileK = 64;        // K rows per pipeline stage: one 16-row k-tile per warp
constexpr int kStages = 4;        // stages in flight (cp.async groups)
constexpr int kBTileBytes = 512;  // one 16 x 64 Marlin block: 128 words
constexpr int kARowBytes = kTileK * 2;
constexpr int kLocksPerNBlock = 16;  // workspace: one lock per (64-column block, block row)

// Bytes of one pipeline stage: A rows, then 4 Marlin B k-tiles, then 64 g_idx entries.
template <int kMBlocks>
struct StageLayout {
  static constexpr int kRows = 16 * kMBlocks;
  static constexpr int kABytes = kRows * kARowBytes;
  static constexpr int kBOffset = kABytes;
  static constexpr int kGidxOffset = kBOffset + (kTileK / 16) * kBTileBytes;
  static constexpr int kBytes = kGidxOffset + kTileK * 4;
  static constexpr int kSmemBytes = kStages * kBytes;
  // Warp partial sums for the final reduction (two slots), reusing the pipeline memory.
  static constexpr int kFragFloats = kMBlocks * 8 * 4;
  static_assert(2 * kFragFloats * 32 * 4 <= kSmemBytes, "reduction slots must fit");
};

// A tile: row r, 16-byte chunk c (k = 8c .. 8c+7) at chunk c ^ (r % 8), so the 8 rows one
// ldmatrix matrix reads hit 8 different bank groups.
__device__ __forceinline__ int a_sh_offset(int r, int c) {
  return r * kARowBytes + 16 * (c ^ (r % 8));
}

using mma::Dtype;
using mma::as_bits;
using mma::bits_as;

// One mma B register: nibbles p (low half) and p + 4 (high half) of q, each (code - zero) * scale
// rounded once. zero_magic holds (magic + z) per half: (magic + q) - (magic + z) = q - z exactly.
template <typename T>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t q, int p, uint32_t zero_magic,
                                                 uint32_t scale) {
  using T2 = typename Dtype<T>::T2;
  // lop3 0xEA = (a & b) | c: the two nibbles land in the two mantissas of magic.
  const uint32_t biased = ptx::lop3<0xEA>(q >> (4 * p), 0x000f000fu, Dtype<T>::kMagic);
  const T2 diff = __hsub2(bits_as<T2>(biased), bits_as<T2>(zero_magic));
  return as_bits<T2>(__hmul2(diff, bits_as<T2>(scale)));
}

struct GemmParams {
  const void* a;  // [M, K] in T, row stride lda elements (lda % 8 == 0)
  int64_t lda;
  const uint32_t* b_q_weight;  // [K/16, 2N] Marlin
  const uint16_t* b_scales;    // [G, N] in T (bit patterns), Marlin-permuted, 16-byte aligned
  const uint32_t* b_zeros;     // [G, N/8] Marlin zero points, or nullptr (z = 8)
  const int32_t* g_idx;        // [K] sorted group of each row, or nullptr (r / group_size)
  const void* b_bias;          // [N] in T, or nullptr
  void* c;                     // [M, N] in T
  int64_t size_m, size_n, size_k;
  int64_t num_groups;  // G
  int64_t group_size;  // rows per group without g_idx
  // Split-K: gridDim.z splits of stages_per_split stages each (1: no split, c_tmp/locks unused).
  int64_t stages_per_split;
  float* c_tmp;  // [M, N] fp32 partial sums
  int* locks;    // [N/64 * kLocksPerNBlock], zero on entry, zero on exit
};

// Block-wide barrier (bar.sync 0 over all threads, what __syncthreads compiles to). Used instead
// of __syncthreads because the host compiler may tail-duplicate a barrier call that follows a
// warp-dependent branch (the reduction below), and the emulator tells __syncthreads sites apart.
__device__ __forceinline__ void block_sync() { ptx::barrier_sync(0, kThreads); }

// Issues the cp.async copies of stage tile s into `st`; the caller commits the group.
template <typename T, int kMBlocks>
__device__ __forceinline__ void fetch_stage(char* st, const GemmParams& p, int64_t s, int64_t m0,
                                            int64_t n_blk) {
  using L = StageLayout<kMBlocks>;
  const int t = threadIdx.x;
  const int64_t k0 = s * kTileK;
  const T* a = static_cast<const T*>(p.a);
  // A: kRows x 8 chunks of 16 bytes; rows past M are zero (their results are not stored).
  for (int i = t; i < L::kRows * 8; i += kThreads) {
    const int r = i / 8, c = i % 8;
    const int64_t row = m0 + r, col = k0 + 8 * c;
    const bool valid = row < p.size_m && col < p.size_k;
    ptx::cp_async16_cg_zfill(st + a_sh_offset(r, c), valid ? a + row * p.lda + col : a, valid);
  }
  // B: k-tile j of the stage is 512 contiguous bytes of Marlin row kt (32 chunks).
  {
    const int j = t / 32, c = t % 32;
    const int64_t kt = s * (kTileK / 16) + j;
    if (kt < p.size_k / 16) {
      ptx::cp_async16_cg(st + L::kBOffset + j * kBTileBytes + 16 * c,
                         p.b_q_weight + kt * 2 * p.size_n + n_blk * 128 + 4 * c);
    }
  }
  // g_idx of the stage's rows (act-order): 16 chunks of 4 entries.
  if (p.g_idx != nullptr && t < kTileK / 4) {
    const int64_t r = k0 + 4 * t;
    if (r < p.size_k) ptx::cp_async16_cg(st + L::kGidxOffset + 16 * t, p.g_idx + r);
  }
}

// Per-lane cache of the scales and zero points of its 8 columns (e = 2j + h) for its two row
// pairs (rp 0: rows 2t, 2t+1 -> b[0]; rp 1: rows 2t+8, 2t+9 -> b[1]), as T2 bit patterns.
template <typename T>
struct LaneScales {
  int group[4];
  uint32_t scale[8][2];
  uint32_t zero_magic[8][2];

  __device__ __forceinline__ void load(const GemmParams& p, const int g4[4], int64_t n_blk,
                                       int lane) {
    const int col_lane = lane / 4;
    const bool single = p.num_groups == 1;
    const uint16_t magic = static_cast<uint16_t>(Dtype<T>::kMagic & 0xffffu);
#pragma unroll
    for (int i = 0; i < 4; ++i) group[i] = g4[i];
#pragma unroll
    for (int rp = 0; rp < 2; ++rp) {
      const int64_t g_lo = g4[2 * rp], g_hi = g4[2 * rp + 1];
      uint32_t z_lo = 0, z_hi = 0;  // zero-point words (all 8 columns of this lane)
      if (p.b_zeros != nullptr) {
        z_lo = p.b_zeros[g_lo * (p.size_n / 8) + n_blk * 8 + col_lane];
        z_hi = p.b_zeros[g_hi * (p.size_n / 8) + n_blk * 8 + col_lane];
      }
      if (!single) {
        // G > 1: the lane's 8 scales are 16 contiguous bytes of each group row; prmt pairs
        // halfword e of the row-2t group with halfword e of the row-2t+1 group.
        const int64_t col = n_blk * kTileN + 8 * col_lane;
        const int4 s_lo = *reinterpret_cast<const int4*>(p.b_scales + g_lo * p.size_n + col);
        const int4 s_hi = *reinterpret_cast<const int4*>(p.b_scales + g_hi * p.size_n + col);
        const uint32_t lo[4] = {uint32_t(s_lo.x), uint32_t(s_lo.y), uint32_t(s_lo.z),
                                uint32_t(s_lo.w)};
        const uint32_t hi[4] = {uint32_t(s_hi.x), uint32_t(s_hi.y), uint32_t(s_hi.z),
                                uint32_t(s_hi.w)};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          scale[e][rp] = ptx::prmt(lo[e / 2], hi[e / 2], e % 2 ? 0x7632u : 0x5410u);
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t col =
              n_blk * kTileN + 32 * (e / 4) + 8 * (col_lane / 2) + 2 * (e % 4) + col_lane % 2;
          scale[e][rp] = uint32_t(p.b_scales[col]) | uint32_t(p.b_scales[col]) << 16;
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        uint32_t zl = 8, zh = 8;
        if (p.b_zeros != nullptr) {
          const int shift = 4 * (e / 2 + 4 * (e % 2));
          zl = (z_lo >> shift) & 15u;
          zh = (z_hi >> shift) & 15u;
        }
        zero_magic[e][rp] = uint32_t(magic | zl) | uint32_t(magic | zh) << 16;
      }
    }
  }
};

// Grid: (N / 64, ceil(M / (16 * kMBlocks))), kThreads threads, StageLayout::kSmemBytes dynamic
// shared memory.
template <typename T, int kMBlocks>
__global__ void __launch_bounds__(kThreads) w4a16_gemm_kernel(const GemmParams p) {
  using L = StageLayout<kMBlocks>;
  using D = Dtype<T>;
  using T2 = typename D::T2;
  W4K_EXTERN_SHARED(int4, sh);
  char* smem = reinterpret_cast<char*>(sh);

  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t n_blk = blockIdx.x;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * L::kRows;
  const int64_t num_k_tiles = p.size_k / 16;
  const int group_size = static_cast<int>(p.group_size);
  // This split's stages [s_begin, s_end).
  const int64_t s_begin = static_cast<int64_t>(blockIdx.z) * p.stages_per_split;
  const int64_t s_end_all = (p.size_k + kTileK - 1) / kTileK;
  const int64_t s_end =
      s_begin + p.stages_per_split < s_end_all ? s_begin + p.stages_per_split : s_end_all;
  const int64_t num_stages = s_end - s_begin;

  float acc[kMBlocks][8][4];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mb][nt][i] = 0.f;

  LaneScales<T> scales;
#pragma unroll
  for (int i = 0; i < 4; ++i) scales.group[i] = -1;

  // One commit per slot even when there is nothing left to fetch, so that "at most
  // kStages - 2 groups pending" always means "stage s has landed".
  // i counts this split's stages; stage s_begin + i sits in slot i % kStages.
  auto fetch = [&](int64_t i) {
    if (i < num_stages)
      fetch_stage<T, kMBlocks>(smem + (i % kStages) * L::kBytes, p, s_begin + i, m0, n_blk);
    ptx::cp_async_commit_group();
  };
  for (int i = 0; i < kStages - 1; ++i) fetch(i);

  for (int64_t i = 0; i < num_stages; ++i) {
    ptx::cp_async_wait_group<kStages - 2>();
    // Stage s is visible to all, and everyone is done with the slot the next fetch reuses.
    block_sync();
    fetch(i + kStages - 1);

    const int64_t kt = (s_begin + i) * (kTileK / 16) + warp;
    if (kt >= num_k_tiles) continue;  // warp-uniform: the last stage may be partial
    const char* st = smem + (i % kStages) * L::kBytes;

    // A fragments: ldmatrix.x4 over rows 16mb .. +15, k 16w .. +15 (lane l: row l%16,
    // k-chunk 2w + l/16).
    uint32_t frag_a[kMBlocks][4];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
      const int r = 16 * mb + lane % 16;
      ptx::ldmatrix_x4(frag_a[mb], st + a_sh_offset(r, 2 * warp + lane / 16));
    }
    // This lane's 4 Marlin words of k-tile kt: one per 16-column n-tile.
    const int4 words =
        *reinterpret_cast<const int4*>(st + L::kBOffset + warp * kBTileBytes + 16 * lane);
    const uint32_t w4[4] = {uint32_t(words.x), uint32_t(words.y), uint32_t(words.z),
                            uint32_t(words.w)};
    // Groups of this lane's four rows; reload scales only when they change.
    int g4[4];
    const int r_lane = 2 * (lane % 4);
    const int r_local[4] = {r_lane, r_lane + 1, r_lane + 8, r_lane + 9};
    const int row0 = static_cast<int>(kt * 16);  // K < 2^31
    if (p.g_idx != nullptr) {
      const int32_t* g_idx_sh = reinterpret_cast<const int32_t*>(st + L::kGidxOffset);
#pragma unroll
      for (int i = 0; i < 4; ++i) g4[i] = g_idx_sh[16 * warp + r_local[i]];
    } else if (group_size % 16 == 0) {
      const int g = row0 / group_size;  // the whole k-tile is in one group
#pragma unroll
      for (int i = 0; i < 4; ++i) g4[i] = g;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) g4[i] = (row0 + r_local[i]) / group_size;
    }
    if (g4[0] != scales.group[0] || g4[1] != scales.group[1] || g4[2] != scales.group[2] ||
        g4[3] != scales.group[3]) {
      scales.load(p, g4, n_blk, lane);
    }

#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 2 * j + h;
        uint32_t frag_b[2];
        frag_b[0] = dequant_pair<T>(w4[j], 2 * h, scales.zero_magic[e][0], scales.scale[e][0]);
        frag_b[1] = dequant_pair<T>(w4[j], 2 * h + 1, scales.zero_magic[e][1], scales.scale[e][1]);
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) D::mma(frag_a[mb], frag_b, acc[mb][e]);
      }
    }
  }
  ptx::cp_async_wait_all();
  block_sync();  // the pipeline memory becomes the reduction buffer

  // Tree reduction of the four warps' partial sums: 2,3 -> 0,1, then 1 -> 0. Slot layout
  // [slot][fragment float][lane] (conflict-free).
  float* red = reinterpret_cast<float*>(smem);
  auto exchange = [&](bool writer, bool reader, int slot_w, int slot_r) {
    if (writer) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            red[(slot_w * L::kFragFloats + (mb * 8 + nt) * 4 + i) * 32 + lane] = acc[mb][nt][i];
    }
    block_sync();
    if (reader) {
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc[mb][nt][i] += red[(slot_r * L::kFragFloats + (mb * 8 + nt) * 4 + i) * 32 + lane];
    }
    block_sync();
  };
  exchange(warp >= 2, warp < 2, warp - 2, warp);
  exchange(warp == 1, warp == 0, 0, 0);
  if (warp != 0) return;

  if (gridDim.z > 1) {
    // Serialized split-K: split z waits until the lock of its tile says z, adds the partial sums
    // of splits 0..z-1 from c_tmp, and passes on (or, the last one, writes the output). Every
    // lane acquires for itself, so that its c_tmp loads see the previous split's stores.
    const int z = blockIdx.z;
    int* lock = p.locks + n_blk * kLocksPerNBlock + blockIdx.y;
    if (z > 0) {
      while (ptx::ld_acquire_gpu(lock) != z) {
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int64_t col = n_blk * kTileN + 8 * nt + 2 * (lane % 4);
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
          const int64_t row = m0 + 16 * mb + lane / 4 + 8 * half_row;
          if (row >= p.size_m) continue;
          float2* partial = reinterpret_cast<float2*>(p.c_tmp + row * p.size_n + col);
          float* c2 = &acc[mb][nt][2 * half_row];
          if (z > 0) {
            const float2 prev = *partial;
            c2[0] += prev.x;
            c2[1] += prev.y;
          }
          if (z + 1 < static_cast<int>(gridDim.z)) *partial = make_float2(c2[0], c2[1]);
        }
      }
    }
    __syncwarp();  // every lane is past its spin and its c_tmp accesses
    if (z + 1 < static_cast<int>(gridDim.z)) {
      __threadfence();
      __syncwarp();
      if (lane == 0) ptx::red_release_gpu_add(lock, 1);
      return;
    }
    if (lane == 0) ptx::st_release_gpu(lock, 0);  // ready for the next launch
  }

  // Output: c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1] of each 16x8 tile.
  const T* bias = static_cast<const T*>(p.b_bias);
  T* out = static_cast<T*>(p.c);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int64_t col = n_blk * kTileN + 8 * nt + 2 * (lane % 4);
    float bias_lo = 0.f, bias_hi = 0.f;
    if (bias != nullptr) {
      bias_lo = D::to_float(bias[col]);
      bias_hi = D::to_float(bias[col + 1]);
    }
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
      for (int half_row = 0; half_row < 2; ++half_row) {
        const int64_t row = m0 + 16 * mb + lane / 4 + 8 * half_row;
        if (row < p.size_m) {
          *reinterpret_cast<T2*>(out + row * p.size_n + col) =
              D::pack(acc[mb][nt][2 * half_row] + bias_lo, acc[mb][nt][2 * half_row + 1] + bias_hi);
        }
      }
    }
  }
}

// Act-order: a_perm[m, r] = a[m, perm[r]] (one block per row of a). An out-of-range perm entry
// gives a zero column instead of an out-of-bounds read (the CPU and SIMT bindings reject it;
// the CUDA binding cannot read perm without a sync).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    permute_cols_kernel(const T* __restrict__ a, int64_t lda, const int32_t* __restrict__ perm,
                        T* __restrict__ a_perm, int64_t size_k) {
  const int64_t m = blockIdx.x;
  for (int64_t r = threadIdx.x; r < size_k; r += kThreads) {
    const int32_t src = perm[r];
    a_perm[m * size_k + r] =
        src >= 0 && src < size_k ? a[m * lda + src] : Dtype<T>::from_float(0.f);
  }
}

// Rows of M per block: Marlin's m_blocks, 16 * (1..4).
inline int64_t tile_rows(int64_t size_m) {
  return size_m <= 16 ? 16 : size_m <= 32 ? 32 : size_m <= 48 ? 48 : 64;
}

// Stages per split so that about target_blocks blocks run (1 split when the tiles alone reach
// it, or when there are more block rows than locks per column block).
inline int64_t stages_per_split(int64_t size_m, int64_t size_n, int64_t size_k,
                                int64_t target_blocks) {
  const int64_t num_stages = (size_k + kTileK - 1) / kTileK;
  const int64_t m_blocks = (size_m + tile_rows(size_m) - 1) / tile_rows(size_m);
  const int64_t tiles = (size_n / kTileN) * m_blocks;
  if (m_blocks > kLocksPerNBlock || tiles >= target_blocks) return num_stages;
  int64_t splits = (target_blocks + tiles - 1) / tiles;
  if (splits > num_stages) splits = num_stages;
  return (num_stages + splits - 1) / splits;
}

template <typename T, int kMBlocks>
cudaError_t launch_gemm_tile(const GemmParams& p, cudaStream_t stream) {
  using L = StageLayout<kMBlocks>;
  const int64_t m_blocks = (p.size_m + L::kRows - 1) / L::kRows;
  const int64_t num_stages = (p.size_k + kTileK - 1) / kTileK;
  const int64_t splits = (num_stages + p.stages_per_split - 1) / p.stages_per_split;
  const dim3 grid(static_cast<unsigned>(p.size_n / kTileN), static_cast<unsigned>(m_blocks),
                  static_cast<unsigned>(splits));
  auto* kernel = &w4a16_gemm_kernel<T, kMBlocks>;
  W4K_LAUNCH(kernel, grid, dim3(kThreads), L::kSmemBytes, stream, p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_gemm(const GemmParams& p, cudaStream_t stream) {
  // Tile height by M (Marlin's m_blocks): one block row covers up to 64 rows of M.
  switch (tile_rows(p.size_m)) {
    case 16:
      return launch_gemm_tile<T, 1>(p, stream);
    case 32:
      return launch_gemm_tile<T, 2>(p, stream);
    case 48:
      return launch_gemm_tile<T, 3>(p, stream);
    default:
      return launch_gemm_tile<T, 4>(p, stream);
  }
}

}  // namespace w4a16

// Stages (of 64 rows of K) per split-K slice for a grid of about target_blocks blocks (e.g. a
// few per SM); a value >= ceil(K / 64) means no split.
inline int64_t w4a16_gemm_stages_per_split(int64_t size_m, int64_t size_n, int64_t size_k,
                                           int64_t target_blocks) {
  return w4a16::stages_per_split(size_m, size_n, size_k, target_blocks);
}

// out [M, N] = a [M, K] (act-order: a[:, perm]) times the Marlin weight; see the header comment
// and ops.w4a16_gemm. T = half or __nv_bfloat16 for a, b_scales, b_bias and out.
// Preconditions (checked by the bindings): K % 16 == 0, N % 64 == 0, M >= 1; a, b_q_weight,
// b_scales and g_idx 16-byte aligned, lda % 8 == 0; perm and g_idx both given or both nullptr,
// g_idx sorted with values in [0, G); a_perm_tmp: M * K elements of T when perm is given (else
// unused); group_size = K / G when g_idx is nullptr.
// Split-K: stages_per_split from w4a16_gemm_stages_per_split (>= the stage count: no split);
// with a split, c_tmp is M * N floats of scratch and locks N / 64 * 16 zeroed ints (the op's
// workspace; left zeroed).
template <typename T>
cudaError_t launch_w4a16_gemm(const T* a, int64_t lda, const uint32_t* b_q_weight,
                              const T* b_scales, const uint32_t* b_zeros, const int32_t* g_idx,
                              const int32_t* perm, T* a_perm_tmp, const T* b_bias, T* out,
                              int64_t size_m, int64_t size_n, int64_t size_k, int64_t num_groups,
                              int64_t group_size, int64_t stages_per_split, float* c_tmp,
                              int* locks, cudaStream_t stream) {
  if (size_m == 0) return cudaSuccess;
  w4a16::GemmParams p{};
  p.a = a;
  p.lda = lda;
  if (perm != nullptr) {
    auto* permute = &w4a16::permute_cols_kernel<T>;
    W4K_LAUNCH(permute, dim3(static_cast<unsigned>(size_m)), dim3(w4a16::kThreads), 0, stream, a,
               lda, perm, a_perm_tmp, size_k);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    p.a = a_perm_tmp;
    p.lda = size_k;
  }
  p.b_q_weight = b_q_weight;
  p.b_scales = reinterpret_cast<const uint16_t*>(b_scales);
  p.b_zeros = b_zeros;
  p.g_idx = g_idx;
  p.b_bias = b_bias;
  p.c = out;
  p.size_m = size_m;
  p.size_n = size_n;
  p.size_k = size_k;
  p.num_groups = num_groups;
  p.group_size = g_idx != nullptr ? 1 : group_size;
  p.stages_per_split = stages_per_split;
  p.c_tmp = c_tmp;
  p.locks = locks;
  return w4a16::launch_gemm<T>(p, stream);
}

}  // namespace w4k
