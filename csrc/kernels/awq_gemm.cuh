// awq_gemm (vLLM awq_gemm semantics, deterministic split-K): fp16/bf16 activations times an
// AutoAWQ WQLinear_GEMM 4-bit weight on tensor cores. Torch-free: compiled by nvcc for the GPU
// and by the host compiler against the SIMT emulator (csrc/simt), from this one source.
//
//   out[m, n] = T(sum_k x[m, k] * w[k, n]),  w[k, n] = T(fma(q[k, n] - z[g, n], s[g, n], +0)),
//   g = k / group_size; the weight is rounded once to T exactly as awq_dequantize does
//   (kernels/awq_dequantize.cuh gives the qweight/qzeros nibble order), products accumulate in
//   fp32 (mma.m16n8k16 f32 accumulators), the output is rounded once.
//
// Dataflow. A block of 4 warps owns a kTileM x kTileN output tile and walks the k-tiles
// (kTileK rows) of its split through a kStages-deep cp.async pipeline: per stage, the raw
// qweight words of the tile ([kTileK, kTileN / 8] uint32), the activation tile ([kTileM, kTileK],
// rows >= M and k >= K zero-filled) and, on the per-tile path, the scales and qzeros rows of the
// tile's group. Weights, scales and zeros carry an L2 evict_first policy. A warp owns
// 16 * kMTiles rows x 64 columns: 8 n8 tiles, 32 * kMTiles fp32 accumulators per lane. The main
// loop is unrolled over the kStages pipeline slots, so that every shared-memory address (copies,
// B words, ldmatrix, scales) is a thread-constant register plus an immediate.
//
// Register dequantization, no second shared-memory pass. The mma B fragment of lane (g, t),
// g = lane / 4, t = lane % 4, holds the (k, k+1) pairs k = 2t and 2t + 8 of ONE column; a qweight
// word holds 8 columns of ONE row. So the mma's column index is remapped: lane g owns qweight
// word column g of the warp (8 real columns) and n8 tile j is "nibble j of every lane's word":
//   n8 tile j, mma column p  <->  real column 8 * (warp word 8 * warp_n + p) + kNibbleCol[j],
// kNibbleCol = {0, 2, 4, 6, 1, 3, 5, 7} (the AWQ nibble order). A lane reads its 4 words
// (rows 2t, 2t+1, 2t+8, 2t+9 of the k16 step) from shared memory, merges each row pair with one
// prmt per byte (byte b of row k in the low 16-bit half, of row k+1 in the high half), and one
// lop3 per pair turns a nibble of that into (B + q[k], B + q[k+1]) as a T pair (fp16 takes the
// high nibble of a byte in place as B + 16 q: no shifts; decode_tile); q - z comes out exactly
// of one hsub2 / hfma2 and one hfma2 with +0 rounds it as awq_dequantize does. Per k16 step and
// lane: 4 LDS, 8 prmt (bf16: + 8 shifts), 16 lop3, 32 half2 ops, for 8 HMMAs at one m16 tile
// (7.6 per HMMA); with kMTiles = 2 each B fragment feeds two HMMAs.
//
// Groups. kGroupPerTile (group_size % kTileK == 0, incl. per-channel, or odd multiples of 32 in
// 64-row tiles): each kGroupK rows of a k-tile lie in one group; every stage carries their scales /
// qzeros rows (the copy side advances the source at group ends, tracked by a running count per
// group row of the stage: no division in the loop; by two rows every k-tile for groups of 32), and
// the lane loads its zero word and 8 scales from the stage at each k-tile (each group) into 4 + 4
// pairs (TileConsts: 9 instructions), from which the decode picks halves with operand selectors.
// Otherwise (any other group size, down to 1, and K not a multiple of the k-tile): the general
// path, on 32-row k-tiles, stores each k-tile row's group index in shared memory (computed
// incrementally per k-tile) and reads the two rows' zeros and scales per row pair from global
// memory (slow, rare path).
//
// Split-K, deterministic and bounded. blockIdx.z takes the contiguous k-tiles
// [z * tiles_per_split, ...). With one split a block rounds and stores its tile. Otherwise each
// split stores its fp32 partial tile into scratch[tile][z], bumps the tile's arrival counter
// (fence + atomicAdd + fence: release / acquire); the LAST split to arrive sums the partials in
// z order 0, 1, ... (fixed fp32 order: bit-identical whatever the block order), stores the
// output and resets the counter to 0. No block waits for another. The planner caps the splits
// so the scratch stays under kMaxScratchBytes.
//
// Per-M-tile configurations (Config<kMTiles, kWarpsM, ...>; kWarpsN = 4 / kWarpsM):
//   M <= 16: 1 x 16 rows per warp, warps side by side along N: 16 x 256 tile. All 4 warps do
//            MMAs on different columns (a 64-column tile would leave 3 of 4 warps idle).
//   M <= 32: 2 x 16 rows per warp, 1 x 4 warps: 32 x 256. Each dequantized B fragment serves
//            two HMMAs, which halves the dequant cost per HMMA.
//   M >  32: 2 x 16 rows per warp, 2 x 2 warps: 64 x 128; more M tiles re-dequantize the weight
//            (vLLM switches to dequantize + matmul at 256 tokens; the bindings do too).
// kTileK = 128 or 64, the largest that divides group_size, and 64 for odd multiples of 32 (two
// scales/qzeros rows per stage, kGroupK = 32; a last tile of 32 rows when K % 64 == 32, see
// Config::kHalfLast): the barrier, waits, copies, loop tests and group constants are paid per
// k-tile (or per group), and at one m16 tile the dequantization alone costs 7.6 instructions per
// HMMA, so the rest must be spread over as many HMMAs as possible; 32 on the general path.
// Limits: M >= 1, N % 8 == 0, 1 <= K < 2^31; N < 2^27 (32-bit copy strides, launch checks); x rows
// 16-byte aligned with K % 8 == 0 or zero padding up to a multiple of 8 (the bindings copy x
// otherwise); qweight / qzeros row strides multiples of 4 words, qweight's at least a tile's
// words (the bindings pad narrower rows), all pointers 16-byte aligned.
#pragma once

#include <cstdint>

#include "kernels/awq_dequantize.cuh"
#include "kernels/cuda_compat.cuh"
#include "kernels/mma_dtype.cuh"
#include "kernels/ptx.cuh"

namespace w4k {
namespace awq {

constexpr int kGemmThreads = 128;  // 4 warps
constexpr int kGemmWarps = kGemmThreads / 32;
// Split-K scratch bound: splits are reduced until splits * tiles * kTileM * kTileN fp32 fit.
constexpr int64_t kMaxScratchBytes = int64_t{4} << 20;

template <int kMTiles_,  // m16 tiles per warp (a B fragment feeds kMTiles HMMAs)
          int kWarpsM_,  // warps along M; the other 4 / kWarpsM_ warps split N
          int kTileK_,   // k rows per pipeline stage (32, 64 or 128)
          int kGroupK_,  // per-tile path: each kGroupK rows of a stage lie in one group and the
                         // stage carries their scales / qzeros row (kTileK, or 32 in 64-row
                         // tiles); 0: the general path
          bool kLongGroups_ = false>  // kGroupK 32: groups of 96, 160, ... (odd multiples of
                                      // 32 above 32), the rows' groups counted; else group 32
struct Config {
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kGemmWarps / kWarpsM;
  static constexpr int kTileK = kTileK_;
  static constexpr int kGroupK = kGroupK_;
  static constexpr bool kGroupPerTile = kGroupK > 0;
  static constexpr bool kLongGroups = kLongGroups_;
  static constexpr int kGroupRows = kGroupPerTile ? kTileK / kGroupK : 0;  // per stage
  static constexpr int kGroupSteps = kGroupPerTile ? kGroupK / 16 : 1;  // k16 steps per group row
  // Groups of 32 in 64-row k-tiles: when K % 64 == 32 the split that ends at K fetches a last
  // k-tile of 32 rows (its B rows 32-63 not copied, its A columns and second scales / qzeros
  // row zero-filled: every weight of the missing rows decodes to (q - 0) * 0 = +0 and meets a
  // zero activation).
  static constexpr bool kHalfLast = kGroupK == 32 && kTileK == 64;
  static constexpr int kTileM = 16 * kMTiles * kWarpsM;
  static constexpr int kTileN = 64 * kWarpsN;
  static constexpr int kWordsN = kTileN / 8;  // qweight words per tile row
  static constexpr int kKSteps = kTileK / 16;
  // cp.async pipeline depth: 4 stages, 3 for 128-row k-tiles (70-84 KiB of shared memory, so
  // that two blocks still fit on an SM).
  static constexpr int kStages = kTileK == 128 ? 3 : 4;
  // Blocks per SM that ptxas builds for (__launch_bounds__; 0: none given, ptxas chooses).
  // M <= 16: 4, as many as the shared memory of 64-row k-tiles allows on an H100 (at most 128
  // registers). Without it ptxas for sm_90 squeezes the 64-row kernels into 80 registers by
  // recomputing the lane's shared addresses from threadIdx every k-tile (+0.5 instructions per
  // HMMA), and spills the general path for sm_80.
  static constexpr int kMinBlocks = kMTiles > 1 ? 0 : 4;

  // One stage in shared memory: B words [kTileK][kBRowWords], A [kTileM][kARowElems] 16-bit,
  // scales [kGroupRows][kTileN] and qzeros [kGroupRows][kWordsN] of the stage's groups
  // (kGroupPerTile), or the group index of each of the kTileK rows (general path, -1 past K).
  // B rows carry 4 words of padding: the LDS.32 of lanes (g, t) hit word 2t * kBRowWords + g,
  // and kBRowWords % 32 in {4, 20} puts the 32 lanes in 32 different banks.
  static constexpr int kBRowWords = kWordsN + 4;
  // A rows carry 16 bytes of padding: the 8 row addresses of an ldmatrix matrix fall in 8
  // different 16-byte bank groups (row pitch 80 or 144 bytes = 5 or 9 bank groups).
  static constexpr int kARowElems = kTileK + 8;
  static constexpr int kBBytes = kTileK * kBRowWords * 4;
  static constexpr int kABytes = kTileM * kARowElems * 2;
  static constexpr int kSBytes = kGroupRows * kTileN * 2;
  static constexpr int kZBytes = kGroupRows * kWordsN * 4;
  static constexpr int kGBytes = kGroupPerTile ? 0 : kTileK * 4;
  static constexpr int kAOffset = kBBytes;
  static constexpr int kSOffset = kAOffset + kABytes;
  static constexpr int kZOffset = kSOffset + kSBytes;
  static constexpr int kGOffset = kZOffset + kZBytes;
  static constexpr int kStageBytes = kGOffset + kGBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;

  // Copy work of one stage in 16-byte chunks. A thread copies kBCpt chunks of one row per
  // visited row, kBTpr threads share a row: chunk j of thread u of a row is chunk j * kBTpr + u,
  // so consecutive lanes copy consecutive chunks (whole 32-byte sectors per instruction) and a
  // thread's chunks sit at compile-time offsets from one pointer per visited row.
  static constexpr int kBChunksPerRow = kWordsN / 4;
  static constexpr int kBIters = kTileK * kBChunksPerRow / kGemmThreads;
  static constexpr int kBCpt = kBIters < kBChunksPerRow / 2 ? kBIters : kBChunksPerRow / 2;
  static constexpr int kBTpr = kBChunksPerRow / kBCpt;
  static constexpr int kBRowsPerSweep = kGemmThreads / kBTpr;
  static constexpr int kBVisits = kBIters / kBCpt;
  // A: the same scheme; with fewer chunks than threads, threads past the tile's rows idle.
  static constexpr int kAChunksPerRow = kTileK / 8;
  static constexpr int kAChunks = kTileM * kAChunksPerRow;
  static constexpr int kAIters = (kAChunks + kGemmThreads - 1) / kGemmThreads;
  static constexpr int kACpt = kAIters < kAChunksPerRow / 2 ? kAIters : kAChunksPerRow / 2;
  static constexpr int kATpr = kAChunksPerRow / kACpt;
  static constexpr int kARowsPerSweep = kGemmThreads / kATpr;
  static constexpr int kAVisits = (kTileM + kARowsPerSweep - 1) / kARowsPerSweep;
  static constexpr int kSChunks = kTileN / 8;
  static constexpr int kZChunks = kWordsN / 4;
  static constexpr int kAcc = kMTiles * 8 * 4;  // fp32 accumulators per thread

  static_assert(kTileK * kBChunksPerRow % kGemmThreads == 0 && kBIters % kBCpt == 0 &&
                    kBRowsPerSweep * kBVisits == kTileK,
                "whole B copy iterations");
  static_assert(kAVisits * kACpt == kAIters || kAChunks < kGemmThreads, "whole A copy iterations");
  static_assert(kGroupRows * (kSChunks + kZChunks) <= kGemmThreads,
                "one scales/zeros chunk per thread");
  static_assert(!kGroupPerTile || (kGroupK % 16 == 0 && kGroupRows * kGroupK == kTileK),
                "whole k16 steps");
  static_assert(!kLongGroups || (kGroupK == 32 && kTileK == 64), "long groups: 32-row halves");
  static_assert(kStageBytes % 16 == 0 && kAOffset % 16 == 0 && kSOffset % 16 == 0 &&
                    kZOffset % 16 == 0 && kGOffset % 16 == 0,
                "16-byte aligned stage parts");
};

// (B + q[k], B + q[k+1]) pairs of a row pair: nibble j of the two words q0 (row k), q1 (row
// k + 1) of one qweight column. prmt puts bytes 0-1 (nibbles 0-3) or 2-3 (nibbles 4-7) of q0
// into the low half and of q1 into the high half; lop3 (a & 0x000f000f) | B extracts one.
template <typename T>
__device__ __forceinline__ void biased_row_pairs(uint32_t q0, uint32_t q1, uint32_t out[8]) {
  constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;
  const uint32_t lo = ptx::prmt(q0, q1, 0x5410), hi = ptx::prmt(q0, q1, 0x7632);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i] = ptx::lop3<kAndOr>(lo >> (4 * i), 0x000f000fu, DequantTraits<T>::kMagic2);
    out[i + 4] = ptx::lop3<kAndOr>(hi >> (4 * i), 0x000f000fu, DequantTraits<T>::kMagic2);
  }
}

// The two b registers of 8 n8 tiles from the words of rows (2t, 2t+1) and (2t+8, 2t+9):
// frag[j][h] = T pair (w[k], w[k+1]) of nibble j, k = 2t + 8h. zb / s: the (B + z, B + z') and
// (s, s') pairs of nibble j for the two rows of each pair (equal halves on the per-tile path).
template <typename T>
__device__ __forceinline__ void dequant_fragments(const uint32_t q[4],
                                                  const typename DequantTraits<T>::pair_t zb[2][8],
                                                  const typename DequantTraits<T>::pair_t s[2][8],
                                                  uint32_t frag[8][2]) {
  using pair_t = typename DequantTraits<T>::pair_t;
  const pair_t zero = bit_cast_u32<pair_t>(0u);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t qb[8];
    biased_row_pairs<T>(q[2 * h], q[2 * h + 1], qb);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // (B + q) - (B + z) = q - z exactly; fma with +0 as awq_dequantize (q == z, s < 0: +0).
      const pair_t diff = __hsub2(bit_cast_u32<pair_t>(qb[j]), zb[h][j]);
      frag[j][h] = u32_of(__hfma2(diff, s[h][j], zero));
    }
  }
}

// fp16 decodes the high nibble of a byte in place (see decode_tile); bf16 cannot.
template <typename T>
constexpr bool kHighNibbleInPlace = DequantTraits<T>::kMagic2 == 0x64006400u;

// Duplicated halves: (p.lo, p.lo) or (p.hi, p.hi). Used only inside the HADD2 / HFMA2 operands
// of the per-tile decode, where nvcc folds them into the .H0_H0 / .H1_H1 operand selectors.
__device__ __forceinline__ half2 dup_half(half2 p, int hi) {
  return hi ? __high2half2(p) : __low2half2(p);
}
__device__ __forceinline__ __nv_bfloat162 dup_half(__nv_bfloat162 p, int hi) {
  return hi ? __high2bfloat162(p) : __low2bfloat162(p);
}

// Per-tile path: the zero and scale constants of one group for a lane's word column, kept as
// the 4 pairs (column 2m, column 2m + 1) = (nibble m, nibble m + 4) the way they arrive (the
// decode picks a half with an operand selector: no per-nibble copies, 8 registers).
//   s[m]: the scales.  z[m]: (B + z) for the low nibbles of a byte (m even); for m odd, fp16
//   takes the high nibbles in place as B + 16 q and z[m] is -(B / 16 + z) (see decode_tile).
template <typename T>
struct TileConsts {
  using pair_t = typename DequantTraits<T>::pair_t;
  pair_t z[4], s[4];

  __device__ __forceinline__ void load(uint32_t zw, uint4 sv) {
    constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;
    constexpr uint32_t kB = DequantTraits<T>::kMagic2;
    s[0] = bit_cast_u32<pair_t>(sv.x), s[1] = bit_cast_u32<pair_t>(sv.y);
    s[2] = bit_cast_u32<pair_t>(sv.z), s[3] = bit_cast_u32<pair_t>(sv.w);
    if (kHighNibbleInPlace<T>) {
      // As the weights: the odd nibbles in place, (1024 + 16 z) * (-1/16) = -(64 + z), exact.
      const pair_t minus_sixteenth = bit_cast_u32<pair_t>(0xac00ac00u);
#pragma unroll
      for (int m = 0; m < 4; m += 2) {
        const uint32_t w = zw >> (4 * m);
        z[m] = bit_cast_u32<pair_t>(ptx::lop3<kAndOr>(w, 0x000f000fu, kB));
        z[m + 1] =
            __hmul2(bit_cast_u32<pair_t>(ptx::lop3<kAndOr>(w, 0x00f000f0u, kB)), minus_sixteenth);
      }
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m) z[m] = bit_cast_u32<pair_t>(biased_pair<T>(zw, m));
    }
  }
};

// The two b registers of the 8 n8 tiles from the words q[0..3] of rows (2t, 2t+1), (2t+8, 2t+9)
// (per-tile path: one group, the same zero and scale for both rows of a pair).
// Nibble j of a word is the low (j even) or high (j odd) nibble of byte j / 2. One prmt per byte
// puts byte j / 2 of row k into the low half and of row k + 1 into the high half (bits 0-7 of
// each); a lop3 then makes the (k, k+1) pair:
//   low nibble:  (P & 0x000f000f) | B = B + q; q - z = (B + q) - (B + z), exact.
//   high nibble, fp16: (P & 0x00f000f0) | B = 1024 + 16 q (the step of fp16 at 1024 is 1, so
//     16 q is exact); q - z = fma(1024 + 16 q, 1/16, -(64 + z)) = (64 + q) - (64 + z), exact
//     (the product is exact and the sum is a small integer). This saves the shift a nibble at
//     bits 4-7 would need: one shift per 2 pairs instead of 3 per 4.
//   high nibble, bf16: bits 4-7 straddle the exponent (7-bit mantissa), so (P >> 4) is decoded
//     as a low nibble.
// Then w = fma(q - z, s, +0) in T, as awq_dequantize rounds it (q == z, s < 0: +0).
template <typename T>
__device__ __forceinline__ void decode_tile(const uint32_t q[4], const TileConsts<T>& c,
                                            uint32_t frag[8][2]) {
  using pair_t = typename DequantTraits<T>::pair_t;
  constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;
  constexpr uint32_t kB = DequantTraits<T>::kMagic2;
  const pair_t zero = bit_cast_u32<pair_t>(0u);
  const pair_t sixteenth = bit_cast_u32<pair_t>(0x2c002c00u);  // fp16 (1/16, 1/16)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Byte b of q[2h] in bits 0-7 (and 8-15), of q[2h + 1] in bits 16-23 (and 24-31).
    uint32_t bytes[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) bytes[b] = ptx::prmt(q[2 * h], q[2 * h + 1], 0x4400 + 0x1111 * b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const pair_t z = dup_half(c.z[j % 4], j / 4), s = dup_half(c.s[j % 4], j / 4);
      pair_t diff;
      if (j % 2 == 0) {
        diff = __hsub2(bit_cast_u32<pair_t>(ptx::lop3<kAndOr>(bytes[j / 2], 0x000f000fu, kB)), z);
      } else if (kHighNibbleInPlace<T>) {
        diff = __hfma2(bit_cast_u32<pair_t>(ptx::lop3<kAndOr>(bytes[j / 2], 0x00f000f0u, kB)),
                       sixteenth, z);
      } else {
        diff =
            __hsub2(bit_cast_u32<pair_t>(ptx::lop3<kAndOr>(bytes[j / 2] >> 4, 0x000f000fu, kB)), z);
      }
      frag[j][h] = u32_of(__hfma2(diff, s, zero));
    }
  }
}

// General path: per-row zero / scale pairs.
__device__ __forceinline__ half2 pair_halves(half2 a, half2 b, int hi) {
  return hi ? __highs2half2(a, b) : __lows2half2(a, b);
}
__device__ __forceinline__ __nv_bfloat162 pair_halves(__nv_bfloat162 a, __nv_bfloat162 b, int hi) {
  return hi ? __highs2bfloat162(a, b) : __lows2bfloat162(a, b);
}

struct GemmParams {
  const void* x;            // [M, K] T, row stride ldx (% 8 == 0), 16-byte aligned
  const uint32_t* qweight;  // [K, N/8], row stride ldq words (% 4 == 0)
  const void* scales;       // [G, N] T
  const uint32_t* qzeros;   // [G, N/8], row stride ldz words (% 4 == 0)
  void* out;                // [M, N] T, contiguous
  float* scratch;           // [tiles][splits][kAcc / 4][kGemmThreads] float4 (splits > 1)
  int* counters;            // [tiles], zero on entry and on exit (splits > 1)
  int64_t ldx, ldq, ldz;
  int64_t size_m, size_n, size_k, group_size;
  int64_t tiles_per_split;  // k-tiles per split (blockIdx.z)
};

template <typename T, typename C>
__global__ void __launch_bounds__(kGemmThreads, C::kMinBlocks) awq_gemm_kernel(const GemmParams p) {
  using pair_t = typename DequantTraits<T>::pair_t;
  W4K_EXTERN_SHARED(int4, sh);
  __shared__ int sh_last;  // split-K: this block is the last split of its tile to arrive
  char* const sh_bytes = reinterpret_cast<char*>(sh);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / C::kWarpsN, warp_n = warp % C::kWarpsN;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * C::kTileM;
  // First word column. The last N tile is shifted left to end at the row stride (launch_awq_gemm
  // checks ldq >= kWordsN), so that every B chunk a block copies lies inside its row and the
  // copies need no per-chunk column predicates; it stores only the columns from its unshifted
  // start (n_store0) on, the previous tile stores the overlap.
  const int64_t n_store0 = static_cast<int64_t>(blockIdx.y) * C::kWordsN;
  const int64_t n_word0 = min(n_store0, p.ldq - C::kWordsN);
  const int64_t words_n = p.size_n / 8;
  const int64_t k_tiles = (p.size_k + C::kTileK - 1) / C::kTileK;
  const int64_t t_begin = static_cast<int64_t>(blockIdx.z) * p.tiles_per_split;
  const int64_t t_end = min(t_begin + p.tiles_per_split, k_tiles);
  const int num_tiles = static_cast<int>(t_end - t_begin);
  const int64_t k_begin = t_begin * C::kTileK;
  const uint64_t policy = ptx::createpolicy_evict_first();

  // ---- copy side: per-thread source pointers, advanced by one k-tile per fetch --------------
  // B: visit v = row b_row + v * kBRowsPerSweep, chunks j * kBTpr + b_u (Config). Every chunk
  // lies inside the row stride (n_word0); words in [N / 8, ldq) only feed columns never stored.
  // Rows past K (general path) are not copied: those words stay stale, and their scale is 0.
  const int b_u = tid % C::kBTpr, b_row = tid / C::kBTpr;
  const uint32_t* b_gl_rd[C::kBVisits];
#pragma unroll
  for (int v = 0; v < C::kBVisits; ++v)
    b_gl_rd[v] = p.qweight + (k_begin + b_row + v * C::kBRowsPerSweep) * p.ldq + n_word0 + 4 * b_u;
  // Between k-tiles; int, so that the advance is one IMAD.WIDE (launch_awq_gemm checks the range).
  const int b_gl_rd_delta_t = static_cast<int>(C::kTileK * p.ldq);
  int b_k_left = static_cast<int>(p.size_k - k_begin) - b_row;  // visit v copied if > v * sweep
  const ptx::HintDst b_sh_wr = ptx::hint_dst(sh_bytes + (b_row * C::kBRowWords + 4 * b_u) * 4);

  // A: visit v = row a_row + v * kARowsPerSweep, chunks j * kATpr + a_u. Rows >= M copy zeros
  // (zfill) from valid row 0.
  const int a_u = tid % C::kATpr, a_row = tid / C::kATpr;
  const T* const x = static_cast<const T*>(p.x);
  const T* a_gl_rd[C::kAVisits];
  bool a_row_ok[C::kAVisits];
#pragma unroll
  for (int v = 0; v < C::kAVisits; ++v) {
    const int r = a_row + v * C::kARowsPerSweep;
    a_row_ok[v] = r < C::kTileM && m0 + r < p.size_m;
    a_gl_rd[v] = x + (a_row_ok[v] ? (m0 + r) * p.ldx : 0) + k_begin + 8 * a_u;
  }
  const bool a_copier = C::kAChunks >= kGemmThreads || a_row < C::kTileM;
  const int a_sh_wr = C::kAOffset + (a_row * C::kARowElems + 8 * a_u) * 2;
  // K % kTileK != 0 only on the general path: there chunk j is copied while its k < K (K % 8 == 0
  // or zero-padded x).
  int a_k_left = static_cast<int>(p.size_k - k_begin) - 8 * a_u;

  // Scales / zeros of a fetched tile's groups (per-tile path): for group row r < kGroupRows of
  // the stage (rows [r kGroupK, (r + 1) kGroupK) of the tile), threads r * kSZChunks + [0,
  // kSChunks) copy the 8 scales of word column n_word0 + chunk, the next kZChunks threads 4
  // qzeros words; one pointer each, advanced when a group ends (kGroupRows == 1) or by
  // kGroupRows rows every k-tile (group_size == kGroupK), or, with kLongGroups, each pointer when
  // its own row's group ends (a group of 96, 160, ... rows holds 3, 5, ... halves of 32 rows, and
  // a k-tile's 64 rows cross at most one group end). Every stage carries its groups' rows
  // (at most 5% of the weight bytes, as many as a new group per k-tile costs anyway), so the
  // compute side rebuilds its constants from the stage with no group bookkeeping of its own.
  constexpr int kSZChunks = C::kSChunks + C::kZChunks;
  const int group_size = static_cast<int>(p.group_size);
  const T* const scales = static_cast<const T*>(p.scales);
  const int sz_row = tid / kSZChunks;
  const bool s_copier = tid % kSZChunks < C::kSChunks;
  const bool sz_copier = tid < C::kGroupRows * kSZChunks;
  const int sz_chunk = s_copier ? tid % kSZChunks : tid % kSZChunks - C::kSChunks;
  const int64_t g_first = (k_begin + C::kGroupK * sz_row) / p.group_size;  // once per block
  // Rows of the copier's current group not yet fetched, from its group row on (a multiple of
  // kTileK on the per-tile path with kGroupRows == 1, of 32 with kLongGroups).
  int fetch_group_left =
      static_cast<int>((g_first + 1) * p.group_size - k_begin - C::kGroupK * sz_row);
  const char* sz_gl_rd =
      s_copier ? reinterpret_cast<const char*>(scales + g_first * p.size_n +
                                               min(8 * (n_word0 + sz_chunk), p.size_n - 8))
               : reinterpret_cast<const char*>(p.qzeros + g_first * p.ldz +
                                               min(n_word0 + 4 * sz_chunk, p.ldz - 4));
  const int sz_gl_rd_delta_g = static_cast<int>(s_copier ? p.size_n * 2 : p.ldz * 4);  // bytes
  const ptx::HintDst sz_sh_wr =
      ptx::hint_dst(sh_bytes + (s_copier ? C::kSOffset + sz_row * C::kTileN * 2 + 16 * sz_chunk
                                         : C::kZOffset + sz_row * C::kWordsN * 4 + 16 * sz_chunk));

  // General path: thread tid < kTileK tracks the group of row k = (fetched tile) * kTileK + tid
  // (tile_g, tile_off: kTileK = tile_g * group_size + tile_off, divided once).
  int row_k = static_cast<int>(k_begin) + tid, row_g = 0, row_off = 0, tile_g = 0, tile_off = 0;
  if (!C::kGroupPerTile) {
    row_g = row_k / group_size;
    row_off = row_k - row_g * group_size;
    tile_g = C::kTileK / group_size;
    tile_off = C::kTileK - tile_g * group_size;
  }

  // The A source pointers lag the fetched tile by `ahead` k-tiles (a constant in the unrolled
  // loops below, so that each copy's source is a pointer plus an immediate); advance_a moves
  // them on by the tiles a pass fetched.
  auto advance_a = [&](int tiles) {
#pragma unroll
    for (int v = 0; v < C::kAVisits; ++v) a_gl_rd[v] += tiles * C::kTileK;
  };

  // Issues the copies of the next k-tile into pipeline slot `slot` (a constant once the main
  // loop is unrolled over the slots: every shared address is a register plus an immediate) if
  // `valid`, then commits a group (an empty one past the split's end). The tile's A columns
  // start `ahead` k-tiles past a_gl_rd (see advance_a). `half`: the tile is K's last and holds
  // 32 rows (kHalfLast; false in the steady-state loop, which never fetches K's last tile).
  auto fetch = [&](int slot, int ahead, bool valid, bool half) {
    half = C::kHalfLast && half;
    if (valid) {
      char* const st = sh_bytes + slot * C::kStageBytes;
#pragma unroll
      for (int v = 0; v < C::kBVisits; ++v) {
        const int row = b_row + v * C::kBRowsPerSweep;
        if (C::kGroupPerTile ? !half || row < C::kGroupK : b_k_left > v * C::kBRowsPerSweep) {
#pragma unroll
          for (int j = 0; j < C::kBCpt; ++j)
            ptx::cp_async16_cg_hint(
                b_sh_wr + slot * C::kStageBytes +
                    (v * C::kBRowsPerSweep * C::kBRowWords + 4 * j * C::kBTpr) * 4,
                b_gl_rd[v] + 4 * j * C::kBTpr, policy);
        }
        b_gl_rd[v] += b_gl_rd_delta_t;
      }
      b_k_left -= C::kTileK;
      if (a_copier) {
#pragma unroll
        for (int v = 0; v < C::kAVisits; ++v) {
#pragma unroll
          for (int j = 0; j < C::kACpt; ++j)
            ptx::cp_async16_cg_zfill(
                st + a_sh_wr + (v * C::kARowsPerSweep * C::kARowElems + 8 * j * C::kATpr) * 2,
                a_gl_rd[v] + ahead * C::kTileK + 8 * j * C::kATpr,
                a_row_ok[v] && (C::kGroupPerTile ? !half || 8 * (a_u + j * C::kATpr) < C::kGroupK
                                                 : a_k_left > 8 * j * C::kATpr));
        }
      }
      a_k_left -= C::kTileK;
      if (C::kGroupPerTile) {
        if (sz_copier && !C::kHalfLast) {
          ptx::cp_async16_cg_hint(sz_sh_wr + slot * C::kStageBytes, sz_gl_rd, policy);
        } else if (sz_copier) {  // group row 1 of a half tile lies past the last group
          ptx::cp_async16_cg_zfill_hint(sz_sh_wr + slot * C::kStageBytes, sz_gl_rd,
                                        !half || sz_row == 0, policy);
        }
        if (C::kGroupRows > 1 && !C::kLongGroups) {
          sz_gl_rd += C::kGroupRows * sz_gl_rd_delta_g;
        } else {  // at most one group end per k-tile (group_size >= kTileK)
          fetch_group_left -= C::kTileK;
          if (fetch_group_left <= 0) {
            fetch_group_left += group_size;
            sz_gl_rd += sz_gl_rd_delta_g;
          }
        }
      } else if (tid < C::kTileK) {
        reinterpret_cast<int*>(st + C::kGOffset)[tid] = row_k < p.size_k ? row_g : -1;
        row_k += C::kTileK;
        row_g += tile_g;
        row_off += tile_off;
        if (row_off >= group_size) row_off -= group_size, ++row_g;
      }
    }
    ptx::cp_async_commit_group();
  };

  // ---- compute side -------------------------------------------------------------------------
  const int g = lane / 4, t = lane % 4;
  // B words of lane (g, t): rows 2t, 2t+1, 2t+8, 2t+9 of each k16 step, word 8 * warp_n + g.
  const int b_sh_rd = ((2 * t) * C::kBRowWords + 8 * warp_n + g) * 4;
  // A (16 x 16 per ldmatrix.x4): lane l addresses row l % 16, k 8 * (l / 16) of the k16 step.
  const int a_sh_rd =
      C::kAOffset + ((16 * C::kMTiles * warp_m + lane % 16) * C::kARowElems + 8 * (lane / 16)) * 2;
  // The lane's zero word and 8 scales in a stage (per-tile path).
  const int z_sh_rd = C::kZOffset + 4 * (8 * warp_n + g);
  const int s_sh_rd = C::kSOffset + 16 * (8 * warp_n + g);
  const int64_t lane_word = n_word0 + 8 * warp_n + g;  // this lane's qweight word column

  float acc[C::kMTiles][8][4];
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;

  // The MMAs of the k-tile in pipeline slot `slot` (a constant, as in fetch).
  auto compute = [&](int slot) {
    const char* const st = sh_bytes + slot * C::kStageBytes;
    TileConsts<T> tc;
#pragma unroll
    for (int ks = 0; ks < C::kKSteps; ++ks) {
      if (C::kGroupPerTile && ks % C::kGroupSteps == 0) {
        const int r = ks / C::kGroupSteps;  // the stage's group row of this k16 step
        tc.load(*reinterpret_cast<const uint32_t*>(st + z_sh_rd + r * C::kWordsN * 4),
                *reinterpret_cast<const uint4*>(st + s_sh_rd + r * C::kTileN * 2));
      }
      const uint32_t* bw =
          reinterpret_cast<const uint32_t*>(st + b_sh_rd) + 16 * ks * C::kBRowWords;
      const uint32_t q[4] = {bw[0], bw[C::kBRowWords], bw[8 * C::kBRowWords],
                             bw[9 * C::kBRowWords]};
      uint32_t frag[8][2];
      if (C::kGroupPerTile) {
        decode_tile<T>(q, tc, frag);
      } else {
        // Rows 16 ks + 2t + {0, 1, 8, 9}: their groups (-1 past K: scale 0, weight 0).
        const int* grp = reinterpret_cast<const int*>(st + C::kGOffset) + 16 * ks + 2 * t;
        const int rows_g[4] = {grp[0], grp[1], grp[8], grp[9]};
        const int64_t zc = min(lane_word, words_n - 1);
        uint32_t zw[4];
        uint32_t s4[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int64_t gr = rows_g[r] < 0 ? 0 : rows_g[r];
          zw[r] = p.qzeros[gr * p.ldz + zc];
          const uint4 sv = *reinterpret_cast<const uint4*>(scales + gr * p.size_n + 8 * zc);
          s4[r][0] = rows_g[r] < 0 ? 0u : sv.x;
          s4[r][1] = rows_g[r] < 0 ? 0u : sv.y;
          s4[r][2] = rows_g[r] < 0 ? 0u : sv.z;
          s4[r][3] = rows_g[r] < 0 ? 0u : sv.w;
        }
        pair_t zb[2][8], sc[2][8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t zp[8];
          biased_row_pairs<T>(zw[2 * h], zw[2 * h + 1], zp);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            zb[h][j] = bit_cast_u32<pair_t>(zp[j]);
            sc[h][j] = pair_halves(bit_cast_u32<pair_t>(s4[2 * h][j % 4]),
                                   bit_cast_u32<pair_t>(s4[2 * h + 1][j % 4]), j / 4);
          }
        }
        dequant_fragments<T>(q, zb, sc, frag);
      }
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
        uint32_t a[4];
        ptx::ldmatrix_x4(a, st + a_sh_rd + (16 * mt * C::kARowElems + 16 * ks) * 2);
#pragma unroll
        for (int j = 0; j < 8; ++j) mma::Dtype<T>::mma(a, frag[j], acc[mt][j]);
      }
    }
  };

  // The split's last tile is K's and holds 32 rows (kHalfLast, K % 64 == 32).
  const bool half_last = C::kHalfLast && t_end == k_tiles && p.size_k % C::kTileK != 0;

  // Prologue: the first kStages - 1 tiles (empty groups past the split keep the count right).
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s)
    fetch(s, s, s < num_tiles, half_last && s == num_tiles - 1);
  advance_a(C::kStages - 1);

  // Tile i sits in slot i % kStages; the loops are unrolled over the slots so that every slot
  // offset is an immediate, and count the tiles left down so that every test compares it with
  // an immediate. While at least 2 kStages - 1 tiles are left, every fetch of a pass is valid
  // and every slot holds a tile: the steady-state loop tests nothing but its own condition
  // (kHalfLast: while at least 2 kStages are left, so that it never fetches K's last tile).
  constexpr int kSteadyTiles = C::kHalfLast ? 2 * C::kStages : 2 * C::kStages - 1;
  int tiles_left = num_tiles;
  for (; tiles_left >= kSteadyTiles; tiles_left -= C::kStages) {
#pragma unroll
    for (int u = 0; u < C::kStages; ++u) {
      ptx::cp_async_wait_group<C::kStages - 2>();
      __syncthreads();  // tile u visible to all; the slot fetch reuses (read at u - 1) free
      fetch((u + C::kStages - 1) % C::kStages, u, true, false);
      compute(u);
    }
    advance_a(C::kStages);
  }
  // The last passes (at most two): fetches past the split's end skipped, the pass left after
  // the last tile.
  for (; tiles_left > 0; tiles_left -= C::kStages) {
#pragma unroll
    for (int u = 0; u < C::kStages; ++u) {
      ptx::cp_async_wait_group<C::kStages - 2>();
      __syncthreads();
      fetch((u + C::kStages - 1) % C::kStages, u, u + C::kStages - 1 < tiles_left,
            half_last && u + C::kStages == tiles_left);
      compute(u);
      if (u + 1 < C::kStages && u + 1 >= tiles_left) break;
    }
    advance_a(C::kStages);
  }
  ptx::cp_async_wait_all();  // nothing in flight when the block exits

  // ---- split-K: the last split to arrive sums the partials in split order ------------------
  const int splits = static_cast<int>(gridDim.z);
  if (splits > 1) {
    const int64_t tile = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
    float4* const tile_scratch =
        reinterpret_cast<float4*>(p.scratch) + tile * splits * (C::kAcc / 4) * kGemmThreads;
    float4* const mine = tile_scratch + blockIdx.z * (C::kAcc / 4) * kGemmThreads + tid;
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        mine[(8 * mt + j) * kGemmThreads] =
            make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
    __threadfence();  // release: the partial is visible before the arrival is counted
    __syncthreads();
    if (tid == 0) sh_last = atomicAdd(p.counters + tile, 1) == splits - 1;
    __syncthreads();
    if (!sh_last) return;
    __threadfence();  // acquire: the other splits' partials
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4* src = tile_scratch + (8 * mt + j) * kGemmThreads + tid;
        float4 sum = src[0];
        for (int z = 1; z < splits; ++z) {
          const float4 v = src[z * (C::kAcc / 4) * kGemmThreads];
          sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        acc[mt][j][0] = sum.x, acc[mt][j][1] = sum.y, acc[mt][j][2] = sum.z, acc[mt][j][3] = sum.w;
      }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch
  }

  // ---- output: lane (g, t) holds, per row, the 8 columns of words 2t and 2t + 1 --------------
  // acc[mt][j][2h + e] = out[row 16 (kMTiles warp_m + mt) + g + 8h][word w_e, column
  // kNibbleCol[j]], w_e = 8 warp_n + 2t + e: columns (2i, 2i + 1) of a word are nibbles (i, i+4).
  T* const out = static_cast<T*>(p.out);
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + 16 * (C::kMTiles * warp_m + mt) + g + 8 * h;
      if (row >= p.size_m) continue;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t word = n_word0 + 8 * warp_n + 2 * t + e;
        if (word >= words_n || word < n_store0) continue;
        uint32_t v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          v[i] = u32_of(mma::Dtype<T>::pack(acc[mt][i][2 * h + e], acc[mt][i + 4][2 * h + e]));
        *reinterpret_cast<uint4*>(out + row * p.size_n + 8 * word) =
            make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
}

}  // namespace awq

// ---- host side -----------------------------------------------------------------------------

// What a launch needs, computed from the shapes alone (the bindings size scratch and counters
// from it, then call launch_awq_gemm with it).
struct AwqGemmPlan {
  int config = 0;   // 0: M <= 16, 1: M <= 32, 2: M > 32 (see the header comment)
  int tile_k = 32;  // 32, 64 or 128
  int group_k = 0;  // Config::kGroupK: rows per scales/qzeros row of a stage, 0: general path
  int64_t tile_m = 0, tile_n = 0;
  int64_t m_tiles = 0, n_tiles = 0, splits = 1, tiles_per_split = 0;
  int64_t scratch_floats = 0;  // fp32 split-K scratch (0 with one split)
  int64_t counters = 0;        // zeroed int32 arrival counters (0 with one split)
};

// split_k_iters (1..32): the k-tiles are dealt out in contiguous runs of
// ceil(k_tiles / split_k_iters) (empty runs dropped), then halved until the scratch fits in
// awq::kMaxScratchBytes. The plan, and so the result, depends on the shapes only.
inline AwqGemmPlan awq_gemm_plan(int64_t size_m, int64_t size_n, int64_t size_k, int64_t group_size,
                                 int64_t split_k_iters) {
  AwqGemmPlan pl;
  // The largest k-tile whose rows split into whole groups; odd multiples of 32 (groups of 32,
  // 96, 160, ...) take 64-row tiles with two scales/qzeros rows per stage, one per 32-row half,
  // also when K % 64 == 32 (a last tile of 32 rows): half the per-k-tile overhead of 32-row
  // tiles.
  if (group_size % 32 == 0) {
    pl.tile_k = group_size % 128 == 0 ? 128 : 64;
    pl.group_k = group_size % 64 == 0 ? pl.tile_k : 32;
  }
  pl.config = size_m <= 16 ? 0 : size_m <= 32 ? 1 : 2;
  pl.tile_m = pl.config == 0 ? 16 : pl.config == 1 ? 32 : 64;
  pl.tile_n = pl.config == 2 ? 128 : 256;
  pl.m_tiles = (size_m + pl.tile_m - 1) / pl.tile_m;
  pl.n_tiles = (size_n + pl.tile_n - 1) / pl.tile_n;
  const int64_t k_tiles = (size_k + pl.tile_k - 1) / pl.tile_k;
  const int64_t tile_floats = pl.tile_m * pl.tile_n;
  int64_t splits = split_k_iters;
  for (;;) {
    pl.tiles_per_split = (k_tiles + splits - 1) / splits;
    pl.splits = (k_tiles + pl.tiles_per_split - 1) / pl.tiles_per_split;
    if (pl.splits == 1 ||
        pl.splits * pl.m_tiles * pl.n_tiles * tile_floats * 4 <= awq::kMaxScratchBytes)
      break;
    splits = splits / 2;
  }
  if (pl.splits > 1) {
    pl.scratch_floats = pl.splits * pl.m_tiles * pl.n_tiles * tile_floats;
    pl.counters = pl.m_tiles * pl.n_tiles;
  }
  return pl;
}

namespace awq {

template <typename T, typename C>
cudaError_t launch_config(const GemmParams& p, const AwqGemmPlan& pl, cudaStream_t stream) {
  auto* kernel = &awq_gemm_kernel<T, C>;
  if (C::kSmemBytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  // M tiles on grid.x (limit 2^31 - 1), N tiles on grid.y, splits on grid.z.
  const dim3 grid(static_cast<unsigned>(pl.m_tiles), static_cast<unsigned>(pl.n_tiles),
                  static_cast<unsigned>(pl.splits));
  W4K_LAUNCH(kernel, grid, dim3(kGemmThreads), C::kSmemBytes, stream, p);
  return cudaGetLastError();
}

template <typename T, int kTileK, int kGroupK, bool kLongGroups = false>
cudaError_t launch_tile_k(const GemmParams& p, const AwqGemmPlan& pl, cudaStream_t stream) {
  switch (pl.config) {
    case 0:
      return launch_config<T, Config<1, 1, kTileK, kGroupK, kLongGroups>>(p, pl, stream);
    case 1:
      return launch_config<T, Config<2, 1, kTileK, kGroupK, kLongGroups>>(p, pl, stream);
    default:
      return launch_config<T, Config<2, 2, kTileK, kGroupK, kLongGroups>>(p, pl, stream);
  }
}

}  // namespace awq

// x [M, K] (row stride ldx % 8 == 0; K % 8 == 0 or the row padded with zeros up to a multiple
// of 8), qweight [K, N/8] (row stride ldq words, % 4 == 0, >= plan.tile_n / 8: the last N tile
// is shifted left to end at the row stride, see n_word0), scales [G, N] contiguous, qzeros
// [G, N/8] (row stride ldz words, % 4 == 0) -> out [M, N] contiguous; every pointer 16-byte
// aligned. plan = awq_gemm_plan(M, N, K, group_size, split_k_iters); with plan.splits > 1,
// scratch holds plan.scratch_floats floats and counters plan.counters zeroed ints (left zeroed).
// Preconditions (checked by the bindings): M, K >= 1, N % 8 == 0, K % group_size == 0.
template <typename T>
cudaError_t launch_awq_gemm(const T* x, int64_t ldx, const uint32_t* qweight, int64_t ldq,
                            const T* scales, const uint32_t* qzeros, int64_t ldz, T* out,
                            float* scratch, int* counters, int64_t size_m, int64_t size_n,
                            int64_t size_k, int64_t group_size, const AwqGemmPlan& plan,
                            cudaStream_t stream) {
  if (size_m == 0 || size_n == 0) return cudaSuccess;
  // The kernel advances its copy pointers by 32-bit byte / word strides.
  if (128 * ldq > INT32_MAX || 2 * size_n > INT32_MAX || 4 * ldz > INT32_MAX)
    return cudaErrorInvalidValue;
  if (ldq < plan.tile_n / 8) return cudaErrorInvalidValue;
  awq::GemmParams p;
  p.x = x, p.qweight = qweight, p.scales = scales, p.qzeros = qzeros, p.out = out;
  p.scratch = scratch, p.counters = counters;
  p.ldx = ldx, p.ldq = ldq, p.ldz = ldz;
  p.size_m = size_m, p.size_n = size_n, p.size_k = size_k, p.group_size = group_size;
  p.tiles_per_split = plan.tiles_per_split;
  if (plan.tile_k == 128) return awq::launch_tile_k<T, 128, 128>(p, plan, stream);
  if (plan.tile_k == 64 && plan.group_k == 64)
    return awq::launch_tile_k<T, 64, 64>(p, plan, stream);
  if (plan.tile_k == 64 && group_size == 32)
    return awq::launch_tile_k<T, 64, 32>(p, plan, stream);
  if (plan.tile_k == 64) return awq::launch_tile_k<T, 64, 32, true>(p, plan, stream);
  return awq::launch_tile_k<T, 32, 0>(p, plan, stream);
}

}  // namespace w4k
