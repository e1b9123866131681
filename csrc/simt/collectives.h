// Warp collectives of the SIMT emulator: shfl, vote, syncwarp, ldmatrix and mma, computed
// bit-exactly per the PTX ISA once every lane of the member mask has arrived (see rendezvous()).
#pragma once

#include <cstring>

#include "simt/runtime.h"

namespace simt {

// ---- shfl.sync ----
// PTX semantics with c = ((32 - width) << 8) | clamp, as CUDA's __shfl*_sync compile to:
//   segmask = c[12:8]; maxLane = (lane & segmask) | (clamp & ~segmask); minLane = lane & segmask
//   up:   j = lane - b;  valid = j >= maxLane      (clamp = 0)
//   down: j = lane + b;  valid = j <= maxLane      (clamp = 31)
//   bfly: j = lane ^ b;  valid = j <= maxLane      (clamp = 31)
//   idx:  j = minLane | (b & ~segmask); valid = j <= maxLane
//   result = valid ? var[j] : var[lane]
enum class ShflMode { Idx, Up, Down, Bfly };
struct ShflIn {
  uint64_t bits;
  int b;
  int c;
};

template <ShflMode mode>
inline void shfl_compute(Block& blk, int warp, Rendezvous& r) {
  int c0 = static_cast<const ShflIn*>(r.in[__builtin_ctz(r.mask)])->c;
  for (uint32_t m = r.mask; m; m &= m - 1) {
    const int lane = __builtin_ctz(m);
    const ShflIn& in = *static_cast<const ShflIn*>(r.in[lane]);
    if (in.c != c0)
      blk.fail_tid(warp * 32 + lane, std::string(r.name) + " with width/clamp " + hex32(in.c) +
                                         " while other lanes use " + hex32(c0));
    const int b = in.b & 31, segmask = (in.c >> 8) & 31, clamp = in.c & 31;
    const int max_lane = (lane & segmask) | (clamp & ~segmask), min_lane = lane & segmask;
    int j = lane;
    bool valid = false;
    switch (mode) {
      case ShflMode::Up:
        j = lane - b;
        valid = j >= max_lane;
        break;
      case ShflMode::Down:
        j = lane + b;
        valid = j <= max_lane;
        break;
      case ShflMode::Bfly:
        j = lane ^ b;
        valid = j <= max_lane;
        break;
      case ShflMode::Idx:
        j = min_lane | (b & ~segmask);
        valid = j <= max_lane;
        break;
    }
    if (!valid) j = lane;
    if (!(r.mask & (1u << j)))
      blk.fail_tid(warp * 32 + lane, std::string(r.name) + " reads lane " + std::to_string(j) +
                                         " which is not in the member mask " + hex32(r.mask) +
                                         " (undefined value on the GPU)");
    *static_cast<uint64_t*>(r.out[lane]) = static_cast<const ShflIn*>(r.in[j])->bits;
  }
}

template <ShflMode mode, class T>
inline T shfl(const char* name, unsigned mask, T var, int b, int width, const void* site) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shfl of a 1..8 byte value");
  if (width <= 0 || width > 32 || (width & (width - 1)))
    fail_here(std::string(name) + " with width " + std::to_string(width) +
              " (must be a power of two <= 32)");
  ShflIn in{0, b, ((32 - width) << 8) | (mode == ShflMode::Up ? 0 : 31)};
  std::memcpy(&in.bits, &var, sizeof(T));
  uint64_t out = 0;
  rendezvous(name, &shfl_compute<mode>, mask, site, &in, &out);
  T res;
  std::memcpy(&res, &out, sizeof(T));
  return res;
}

// ---- vote / syncwarp ----
inline void ballot_compute(Block&, int, Rendezvous& r) {
  uint32_t bits = 0;
  for (uint32_t m = r.mask; m; m &= m - 1)
    if (*static_cast<const int*>(r.in[__builtin_ctz(m)])) bits |= 1u << __builtin_ctz(m);
  for (uint32_t m = r.mask; m; m &= m - 1) *static_cast<uint32_t*>(r.out[__builtin_ctz(m)]) = bits;
}
inline uint32_t ballot(const char* name, unsigned mask, int pred, const void* site) {
  uint32_t out = 0;
  rendezvous(name, &ballot_compute, mask, site, &pred, &out);
  return out;
}
inline void syncwarp_compute(Block&, int, Rendezvous&) {}

// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 ----
// Matrix i (0 <= i < num) has its 8 rows at the addresses given by lanes 8i .. 8i+7, each row
// 8 consecutive b16 (16 bytes, 16-byte aligned, in shared memory). Lane t receives in register
// i the pair (row t/4, cols 2*(t%4), 2*(t%4)+1) of matrix i, low half = lower column; with
// .trans it receives (rows 2*(t%4), 2*(t%4)+1, col t/4), i.e. the same of the transpose.
template <int num, bool trans>
inline void ldmatrix_compute(Block&, int, Rendezvous& r) {
  for (int i = 0; i < num; ++i) {
    uint16_t mat[8][8];
    for (int row = 0; row < 8; ++row)
      std::memcpy(mat[row], *static_cast<const void* const*>(r.in[8 * i + row]), 16);
    for (int t = 0; t < 32; ++t) {
      const int g = t / 4, c = 2 * (t % 4);
      const uint16_t lo = trans ? mat[c][g] : mat[g][c];
      const uint16_t hi = trans ? mat[c + 1][g] : mat[g][c + 1];
      static_cast<uint32_t*>(r.out[t])[i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}

// Entry points called from the inlined ptx.cuh wrappers are noinline: their return address
// identifies the kernel's call site.
template <int num, bool trans>
__attribute__((noinline)) void ldmatrix(const char* name, uint32_t* regs, const void* smem_row) {
  const void* site = __builtin_return_address(0);
  // Only lanes 0 .. 8*num-1 supply addresses; the others' operand is ignored by the hardware.
  if (current().lane < 8 * num) check_shared_address(name, smem_row, 16);
  uint32_t out[4];
  rendezvous(name, &ldmatrix_compute<num, trans>, 0xffffffffu, site, &smem_row, out);
  for (int i = 0; i < num; ++i) regs[i] = out[i];
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 ----
// Fragments (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane / 4 and t = lane % 4, each 32-bit register holding two elements, low half first:
//   A (16x16, row-major): a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//                         a[2] = A[g][2t+8, 2t+9]  a[3] = A[g+8][2t+8, 2t+9]
//   B (16x8, k x n):      b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   C, D (16x8, f32):     c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// D = A*B + C. Products of two f16/bf16 values are exact in f32; they are accumulated in f32
// starting from C in ascending k. (The tensor core's summation order and intermediate precision
// are unspecified; tests compare against float64 with a tolerance.)
struct MmaIn {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};

template <class T>
inline void mma_compute(Block&, int, Rendezvous& r) {
  float A[16][16], B[16][8], C[16][8];
  auto elem = [](uint32_t reg, int hi) {
    return float(to_double(from_bits<T>(uint16_t(reg >> (16 * hi)))));
  };
  for (int lane = 0; lane < 32; ++lane) {
    const MmaIn& in = *static_cast<const MmaIn*>(r.in[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = elem(in.a[0], h);
      A[g + 8][2 * t + h] = elem(in.a[1], h);
      A[g][2 * t + 8 + h] = elem(in.a[2], h);
      A[g + 8][2 * t + 8 + h] = elem(in.a[3], h);
      B[2 * t + h][g] = elem(in.b[0], h);
      B[2 * t + 8 + h][g] = elem(in.b[1], h);
      C[g][2 * t + h] = in.c[h];
      C[g + 8][2 * t + h] = in.c[2 + h];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    float* d = static_cast<float*>(r.out[lane]);
    for (int q = 0; q < 4; ++q) {
      const int row = g + 8 * (q / 2), col = 2 * t + (q % 2);
      float acc = C[row][col];
      // the product is exact in float; going through double keeps the compiler from fusing
      // the add into an fma (float(double(x) + double(y)) == the float sum: 53 >= 2*24 + 2)
      for (int k = 0; k < 16; ++k) acc = float(double(acc) + double(A[row][k] * B[k][col]));
      d[q] = acc;
    }
  }
}

template <class T>
__attribute__((noinline)) void mma_m16n8k16(const char* name, const uint32_t a[4],
                                            const uint32_t b[2], float c[4]) {
  const void* site = __builtin_return_address(0);
  MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, c, sizeof in.c);
  float d[4];
  rendezvous(name, &mma_compute<T>, 0xffffffffu, site, &in, d);
  std::memcpy(c, d, sizeof d);
}

}  // namespace simt
