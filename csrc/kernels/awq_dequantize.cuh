// Dequantize an AutoAWQ WQLinear_GEMM weight (vLLM awq_dequantize). Torch-free: compiled by nvcc
// for the GPU and by the host compiler against the SIMT emulator, from this one source.
//
// Notation: K = size_k (rows of qweight), N = size_n = 8 * qweight.size(1), G groups,
// group_size = K / G.
//   qweight uint32 [K, N/8], qzeros uint32 [G, N/8]: nibble i (bits 4i..4i+3) of word [k, c]
//     holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]; so nibbles m and m+4 hold columns 2m and
//     2m+1, which is what lets one lop3 turn a shifted word into a (column 2m, column 2m+1) pair.
//   scales [G, N] (fp16 or bf16), out [K, N] same dtype:
//     out[k, n] = fma(q[k, n] - z[k/group_size, n], s[k/group_size, n], +0)
//   q - z is an integer in -15..15, so the product is exact before the single round-to-nearest-
//   even; the +0 addend turns a -0 product (q == z, s < 0) into +0, as vLLM's fma.rn.f16x2 does.
//
// One thread per qweight word: 8 consecutive columns of one row, a 16-byte scales load and a
// 16-byte output store. threadIdx.x runs along the words of a row (coalesced), threadIdx.y over
// rows; any K >= 1 and N % 8 == 0 are handled (threads past the edges return).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda_compat.cuh"
#include "kernels/ptx.cuh"

namespace w4k {
namespace awq {

// Per-dtype pieces of the nibble -> 16-bit float conversion. kMagic2 is the pair (B, B) with B
// a power of two whose mantissa step is exactly 1, so (bits of B) | q is the float B + q for
// q in 0..15: fp16 1024 = 0x6400 (10-bit mantissa), bf16 128 = 0x4300 (7-bit mantissa).
template <typename scalar_t>
struct DequantTraits;

template <>
struct DequantTraits<half> {
  using pair_t = half2;
  static constexpr uint32_t kMagic2 = 0x64006400u;
};

template <>
struct DequantTraits<__nv_bfloat16> {
  using pair_t = __nv_bfloat162;
  static constexpr uint32_t kMagic2 = 0x43004300u;
};

template <typename T>
__device__ __forceinline__ T bit_cast_u32(uint32_t u) {
  static_assert(sizeof(T) == 4, "pair types are 32 bits");
  T v;
  memcpy(&v, &u, 4);
  return v;
}

template <typename T>
__device__ __forceinline__ uint32_t u32_of(T v) {
  static_assert(sizeof(T) == 4, "pair types are 32 bits");
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// (B + nibble m, B + nibble m+4) of `word` as a pair: lop3 computes (a & b) | c.
template <typename scalar_t>
__device__ __forceinline__ uint32_t biased_pair(uint32_t word, int m) {
  constexpr int kAndOr = (0xf0 & 0xcc) | 0xaa;
  return ptx::lop3<kAndOr>(word >> (4 * m), 0x000f000fu, DequantTraits<scalar_t>::kMagic2);
}

// Grid: (ceil(K / blockDim.y), ceil((N/8) / blockDim.x)): rows on x because grid.x has the
// large limit (K can exceed 65535 * blockDim.y). scales and out must be 16-byte aligned.
template <typename scalar_t>
__global__ void awq_dequantize_kernel(const uint32_t* __restrict__ qweight,  // [K, N/8]
                                      const scalar_t* __restrict__ scales,   // [G, N]
                                      const uint32_t* __restrict__ qzeros,   // [G, N/8]
                                      scalar_t* __restrict__ out,            // [K, N]
                                      int64_t size_k, int64_t size_n, int64_t group_size) {
  using pair_t = typename DequantTraits<scalar_t>::pair_t;
  const int64_t words_per_row = size_n / 8;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (k >= size_k || c >= words_per_row) return;
  const int64_t g = k / group_size;

  const uint32_t q = qweight[k * words_per_row + c];
  const uint32_t z = qzeros[g * words_per_row + c];
  const uint4 s = *reinterpret_cast<const uint4*>(scales + g * size_n + 8 * c);
  const uint32_t s_pairs[4] = {s.x, s.y, s.z, s.w};
  const pair_t zero = bit_cast_u32<pair_t>(0u);

  uint32_t o_pairs[4];
  for (int m = 0; m < 4; ++m) {
    // (B + q) - (B + z) = q - z exactly (both operands and the result are small integers).
    const pair_t diff = __hsub2(bit_cast_u32<pair_t>(biased_pair<scalar_t>(q, m)),
                                bit_cast_u32<pair_t>(biased_pair<scalar_t>(z, m)));
    o_pairs[m] = u32_of(__hfma2(diff, bit_cast_u32<pair_t>(s_pairs[m]), zero));
  }
  *reinterpret_cast<uint4*>(out + k * size_n + 8 * c) =
      make_uint4(o_pairs[0], o_pairs[1], o_pairs[2], o_pairs[3]);
}

}  // namespace awq

// qweight [K, N/8], scales [G, N], qzeros [G, N/8] -> out [K, N], group_size = K / G.
// block_x, block_y: threads per block along words / rows (vLLM's thx, thy); 0 picks (32, 8).
// Preconditions (checked by the bindings): N % 8 == 0, K % G == 0, scales and out 16-byte
// aligned.
template <typename scalar_t>
cudaError_t launch_awq_dequantize(const uint32_t* qweight, const scalar_t* scales,
                                  const uint32_t* qzeros, scalar_t* out, int64_t size_k,
                                  int64_t size_n, int64_t group_size, int block_x, int block_y,
                                  cudaStream_t stream) {
  const int64_t words_per_row = size_n / 8;
  if (size_k == 0 || words_per_row == 0) return cudaSuccess;
  // A requested shape that cannot be launched (too many threads, or more than 65535 column
  // blocks) falls back to the default: the result never depends on the launch shape.
  if (block_x <= 0 || block_y <= 0 || block_x * block_y > 1024 ||
      (words_per_row + block_x - 1) / block_x > 65535) {
    block_x = 32, block_y = 8;
  }
  const dim3 block(block_x, block_y);
  const dim3 grid(static_cast<unsigned>((size_k + block_y - 1) / block_y),
                  static_cast<unsigned>((words_per_row + block_x - 1) / block_x));
  W4K_LAUNCH(awq::awq_dequantize_kernel<scalar_t>, grid, block, 0, stream, qweight, scales,
             qzeros, out, size_k, size_n, group_size);
  return cudaGetLastError();
}

}  // namespace w4k
