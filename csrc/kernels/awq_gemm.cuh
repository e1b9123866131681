// awq_gemm (vLLM awq_gemm semantics, deterministic split-K): fp16/bf16 activations times an
// AutoAWQ WQLinear_GEMM 4-bit weight on tensor cores. Torch-free: compiled by nvcc for the GPU
// and by the host compiler against the SIMT emulator (csrc/simt), from this one source.
//
//   out[m, n] = T(sum_k x[m, k] * w[k, n]),  w[k, n] = T(fma(q[k, n] - z[g, n], s[g, n], +0)),
//   g = k / group_size; the weight is rounded once to T exactly as awq_dequantize does
//   (kernels/awq_dequantize.cuh gives the qweight/qzeros nibble order), products accumulate in
//   fp32 (mma.m16n8k16 f32 accumulators), the output is rounded once.
//
// Kernel shape: a block of 4 warps owns a 64 x 64 output tile (warp w: rows 16w .. 16w+15, all
// 64 columns = 8 n8 tiles, 32 fp32 accumulators per lane) and walks its split's k-tiles of 32
// rows. Per k-tile the block copies the 64 x 32 activation tile to shared memory (rows >= M and
// k >= K as zeros) and dequantizes the 32 x 64 weight tile there (one qweight word = 8 columns
// per thread and step, columns >= N and k >= K as zeros); warps then read A fragments with
// ldmatrix and B fragments with ldmatrix.trans. Both tiles are padded by 16 bytes per row so the
// 8 row addresses of one ldmatrix matrix fall in 8 different bank groups.
// Split-K: blockIdx.z takes the contiguous k-tiles [z * tiles_per_split, ...) and stores its fp32
// partial tile to partial[z, M, N]; a second kernel adds the splits in increasing z (fp32, fixed
// order: deterministic) and rounds once. M: any size >= 1; N: any multiple of 8; K: any size.
#pragma once

#include <cstdint>

#include "kernels/awq_dequantize.cuh"
#include "kernels/cuda_compat.cuh"
#include "kernels/mma_dtype.cuh"
#include "kernels/ptx.cuh"

namespace w4k {
namespace awq {

constexpr int kGemmThreads = 128;      // 4 warps
constexpr int kGemmTileM = 64;         // 16 rows per warp
constexpr int kGemmTileN = 64;         // 8 qweight words per row
constexpr int kGemmTileK = 32;         // two mma k-steps
constexpr int kAStride = kGemmTileK + 8;  // 16-bit elements per shared A row (80 bytes)
constexpr int kBStride = kGemmTileN + 8;  // 16-bit elements per shared B row (144 bytes)
constexpr int kReduceThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kGemmThreads)
    awq_gemm_kernel(const T* __restrict__ x,              // [M, K], row stride ldx
                    const uint32_t* __restrict__ qweight,  // [K, N/8]
                    const T* __restrict__ scales,          // [G, N], 16-byte aligned
                    const uint32_t* __restrict__ qzeros,   // [G, N/8]
                    float* __restrict__ partial,           // [splits, M, N]
                    int64_t ldx, int64_t size_m, int64_t size_n, int64_t size_k,
                    int64_t group_size, int64_t tiles_per_split) {
  using pair_t = typename DequantTraits<T>::pair_t;
  __shared__ int4 sh_a_raw[kGemmTileM * kAStride * 2 / 16];
  __shared__ int4 sh_b_raw[kGemmTileK * kBStride * 2 / 16];
  uint16_t* sh_a = reinterpret_cast<uint16_t*>(sh_a_raw);
  uint16_t* sh_b = reinterpret_cast<uint16_t*>(sh_b_raw);
  const uint16_t* x_bits = reinterpret_cast<const uint16_t*>(x);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kGemmTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kGemmTileN;
  const int64_t words_per_row = size_n / 8;
  const int64_t k_tiles = (size_k + kGemmTileK - 1) / kGemmTileK;
  const int64_t t_begin = static_cast<int64_t>(blockIdx.z) * tiles_per_split;
  const int64_t t_end = t_begin + tiles_per_split < k_tiles ? t_begin + tiles_per_split : k_tiles;
  // Warp-uniform: a warp whose 16 rows all lie past M skips its mma (they would multiply zeros).
  const bool warp_has_rows = m0 + 16 * warp < size_m;
  const pair_t zero = bit_cast_u32<pair_t>(0u);

  float acc[8][4];
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  for (int64_t t = t_begin; t < t_end; ++t) {
    const int64_t k0 = t * kGemmTileK;
    {  // A: thread copies row tid / 2, k = 16 * (tid % 2) .. +15 (element loads: any ldx, K).
      const int r = tid / 2, c0 = 16 * (tid % 2);
      const int64_t m = m0 + r;
      for (int j = 0; j < 16; ++j) {
        const int64_t k = k0 + c0 + j;
        sh_a[r * kAStride + c0 + j] = m < size_m && k < size_k ? x_bits[m * ldx + k] : 0;
      }
    }
    // B: 32 rows x 8 words; item i -> row i / 8, word i % 8; 8 dequantized columns per item.
    for (int i = tid; i < kGemmTileK * 8; i += kGemmThreads) {
      const int r = i / 8, w = i % 8;
      const int64_t k = k0 + r, c = n0 / 8 + w;
      uint32_t o[4] = {0u, 0u, 0u, 0u};
      if (k < size_k && c < words_per_row) {
        const int64_t g = k / group_size;
        const uint32_t q = qweight[k * words_per_row + c];
        const uint32_t z = qzeros[g * words_per_row + c];
        const uint4 s = *reinterpret_cast<const uint4*>(scales + g * size_n + 8 * c);
        const uint32_t s_pairs[4] = {s.x, s.y, s.z, s.w};
        for (int p = 0; p < 4; ++p) {
          // (B + q) - (B + z) = q - z exactly; fma with +0 as awq_dequantize.
          const pair_t diff = __hsub2(bit_cast_u32<pair_t>(biased_pair<T>(q, p)),
                                      bit_cast_u32<pair_t>(biased_pair<T>(z, p)));
          o[p] = u32_of(__hfma2(diff, bit_cast_u32<pair_t>(s_pairs[p]), zero));
        }
      }
      *reinterpret_cast<uint4*>(sh_b + r * kBStride + 8 * w) = make_uint4(o[0], o[1], o[2], o[3]);
    }
    __syncthreads();
    if (warp_has_rows) {
      for (int ks = 0; ks < kGemmTileK / 16; ++ks) {
        // A (16 x 16, row major): lane l addresses row l % 16, k 8 * (l / 16) of the k-step.
        uint32_t a[4];
        ptx::ldmatrix_x4(a, sh_a + (16 * warp + lane % 16) * kAStride + 16 * ks + 8 * (lane / 16));
        for (int jp = 0; jp < 4; ++jp) {
          // B (k x n in shared memory), transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7),
          // (k 0-7, n 8-15), (k 8-15, n 8-15) = b[0..1] of n-tile 2jp, b[0..1] of 2jp + 1.
          uint32_t b[4];
          ptx::ldmatrix_x4_trans(
              b, sh_b + (16 * ks + lane % 8 + 8 * ((lane / 8) % 2)) * kBStride + 16 * jp +
                     8 * (lane / 16));
          mma::Dtype<T>::mma(a, b, acc[2 * jp]);
          mma::Dtype<T>::mma(a, b + 2, acc[2 * jp + 1]);
        }
      }
    }
    __syncthreads();
  }

  if (!warp_has_rows) return;
  // Accumulator e of n-tile j: row lane / 4 (+ 8 for e >= 2), column 8j + 2 * (lane % 4) + e % 2.
  float* dst = partial + static_cast<int64_t>(blockIdx.z) * size_m * size_n;
  const int64_t row = m0 + 16 * warp + lane / 4;
  for (int j = 0; j < 8; ++j) {
    const int64_t col = n0 + 8 * j + 2 * (lane % 4);
    if (col >= size_n) break;  // N % 8 == 0: an n8 tile is entirely inside or outside
    for (int h = 0; h < 2; ++h) {
      const int64_t m = row + 8 * h;
      if (m < size_m) {
        dst[m * size_n + col] = acc[j][2 * h];
        dst[m * size_n + col + 1] = acc[j][2 * h + 1];
      }
    }
  }
}

// out[i] = T(partial[0, i] + partial[1, i] + ... ) over the splits, in increasing split order.
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    awq_gemm_reduce_kernel(const float* __restrict__ partial, T* __restrict__ out,
                           int64_t size_mn, int64_t splits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x;
  if (i >= size_mn) return;
  float sum = partial[i];
  for (int64_t z = 1; z < splits; ++z) sum += partial[z * size_mn + i];
  out[i] = mma::Dtype<T>::from_float(sum);
}

}  // namespace awq

// Number of k splits actually launched for split_k_iters (1..32): k-tiles are dealt out in
// contiguous runs of ceil(k_tiles / split_k_iters), so the last runs may be empty and dropped.
inline int64_t awq_gemm_splits(int64_t size_k, int64_t split_k_iters) {
  const int64_t k_tiles = (size_k + awq::kGemmTileK - 1) / awq::kGemmTileK;
  const int64_t per_split = (k_tiles + split_k_iters - 1) / split_k_iters;
  return (k_tiles + per_split - 1) / per_split;
}

// x [M, K] (row stride ldx, unit column stride), qweight [K, N/8], scales [G, N] (16-byte
// aligned), qzeros [G, N/8] -> out [M, N] (contiguous); partial: fp32 scratch of at least
// awq_gemm_splits(K, split_k_iters) * M * N floats. Preconditions (checked by the bindings):
// M, K >= 1, N % 8 == 0, K % group_size == 0, 1 <= split_k_iters <= 32.
template <typename T>
cudaError_t launch_awq_gemm(const T* x, int64_t ldx, const uint32_t* qweight, const T* scales,
                            const uint32_t* qzeros, float* partial, T* out, int64_t size_m,
                            int64_t size_n, int64_t size_k, int64_t group_size,
                            int64_t split_k_iters, cudaStream_t stream) {
  if (size_m == 0 || size_n == 0) return cudaSuccess;
  const int64_t k_tiles = (size_k + awq::kGemmTileK - 1) / awq::kGemmTileK;
  const int64_t per_split = (k_tiles + split_k_iters - 1) / split_k_iters;
  const int64_t splits = awq_gemm_splits(size_k, split_k_iters);
  // M tiles on grid.x (limit 2^31 - 1), 64-column tiles on grid.y, splits on grid.z.
  const dim3 grid(static_cast<unsigned>((size_m + awq::kGemmTileM - 1) / awq::kGemmTileM),
                  static_cast<unsigned>((size_n + awq::kGemmTileN - 1) / awq::kGemmTileN),
                  static_cast<unsigned>(splits));
  W4K_LAUNCH(awq::awq_gemm_kernel<T>, grid, dim3(awq::kGemmThreads), 0, stream, x, qweight,
             scales, qzeros, partial, ldx, size_m, size_n, size_k, group_size, per_split);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t size_mn = size_m * size_n;
  const dim3 reduce_grid(
      static_cast<unsigned>((size_mn + awq::kReduceThreads - 1) / awq::kReduceThreads));
  W4K_LAUNCH(awq::awq_gemm_reduce_kernel<T>, reduce_grid, dim3(awq::kReduceThreads), 0, stream,
             partial, out, size_mn, splits);
  return cudaGetLastError();
}

}  // namespace w4k
