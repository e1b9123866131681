// CPU kernels of marlin_repack (GPTQ source, optional act-order perm) and awq_marlin_repack.
//
// Layout (python/w4kernels/reference.py has the full formula): output row kt = k / 16 is the
// concatenation of 16x16 tiles, cut in 1024-value chunks of 64 columns; packed position p of a
// chunk holds the value at (row kRow[p], column nCol[p]) of that 16 x 64 block, and positions
// 8w..8w+7 form int32 word w of the chunk. Both sources are first unpacked into a 16 x N byte
// block of codes (one Marlin k-tile), then every chunk is packed from it through the table.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <vector>

#include "marlin_checks.h"

namespace w4k {
namespace {

constexpr int64_t kTile = 16;        // rows of K per Marlin tile row
constexpr int64_t kChunkCols = 64;   // columns of N per 1024-value chunk
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // AWQ: column 8c+j is nibble [j]

// Where packed position p (0..1023) of a chunk comes from, as (row in tile, column in chunk).
struct ChunkTable {
  std::array<uint8_t, 1024> row;
  std::array<uint8_t, 1024> col;
  ChunkTable() {
    static constexpr int interleave[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    int p = 0;
    for (int i = 0; i < 32; ++i) {  // lane i of a warp
      int base[8], nb = 0;
      for (int block = 0; block < 2; ++block) {
        const int rows[4] = {2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1};
        for (int r : rows) base[nb++] = 16 * r + i / 4 + 8 * block;
      }
      for (int tile = 0; tile < 4; ++tile) {
        for (int v = 0; v < 8; ++v) {
          const int src = base[interleave[v]] + 256 * tile;  // index in the 4 flattened tiles
          row[p] = static_cast<uint8_t>((src % 256) / 16);
          col[p] = static_cast<uint8_t>(16 * (src / 256) + src % 16);
          ++p;
        }
      }
    }
  }
};

const ChunkTable& chunk_table() {
  static const ChunkTable table;
  return table;
}

// codes: 16 x size_n bytes (one k-tile) -> out: 2 * size_n int32 (one Marlin row).
void pack_tile_row(const uint8_t* codes, int64_t size_n, int32_t* out) {
  const ChunkTable& t = chunk_table();
  for (int64_t n0 = 0; n0 < size_n; n0 += kChunkCols) {
    int32_t* words = out + (n0 / kChunkCols) * 128;
    for (int w = 0; w < 128; ++w) {
      uint32_t word = 0;
      for (int v = 0; v < 8; ++v) {
        const int p = 8 * w + v;
        word |= uint32_t(codes[t.row[p] * size_n + n0 + t.col[p]]) << (4 * v);
      }
      words[w] = static_cast<int32_t>(word);
    }
  }
}

// GPTQ: code (k, n) is nibble k % 8 of word [k / 8, n]; Marlin row r reads GPTQ row perm[r].
void repack_gptq(const int32_t* src, const int32_t* perm, int64_t size_k, int64_t size_n,
                 int32_t* out) {
  at::parallel_for(0, size_k / kTile, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(kTile * size_n);
    for (int64_t kt = begin; kt < end; ++kt) {
      for (int64_t r = 0; r < kTile; ++r) {
        const int64_t k = perm ? perm[kt * kTile + r] : kt * kTile + r;
        const uint32_t* row = reinterpret_cast<const uint32_t*>(src) + (k / 8) * size_n;
        const int shift = 4 * (k % 8);
        for (int64_t n = 0; n < size_n; ++n) codes[r * size_n + n] = (row[n] >> shift) & 15;
      }
      pack_tile_row(codes.data(), size_n, out + kt * 2 * size_n);
    }
  });
}

// AWQ: code (k, n) is nibble kAwqNibble[n % 8] of word [k, n / 8].
void repack_awq(const int32_t* src, int64_t size_k, int64_t size_n, int32_t* out) {
  at::parallel_for(0, size_k / kTile, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> codes(kTile * size_n);
    for (int64_t kt = begin; kt < end; ++kt) {
      for (int64_t r = 0; r < kTile; ++r) {
        const uint32_t* row = reinterpret_cast<const uint32_t*>(src) + (kt * kTile + r) * (size_n / 8);
        uint8_t* dst = codes.data() + r * size_n;
        for (int64_t c = 0; c < size_n / 8; ++c) {
          for (int j = 0; j < 8; ++j) dst[8 * c + j] = (row[c] >> (4 * kAwqNibble[j])) & 15;
        }
      }
      pack_tile_row(codes.data(), size_n, out + kt * 2 * size_n);
    }
  });
}

at::Tensor marlin_repack_cpu(const at::Tensor& b_q_weight, const std::optional<at::Tensor>& perm,
                             c10::SymInt size_k_s, c10::SymInt size_n_s, int64_t num_bits) {
  const int64_t size_k = size_k_s.expect_int(), size_n = size_n_s.expect_int();
  check_marlin_repack_args(b_q_weight, perm, size_k, size_n, num_bits, c10::DeviceType::CPU);
  at::Tensor out = at::empty({size_k / kTile, size_n * kTile / 8}, b_q_weight.options());
  repack_gptq(b_q_weight.data_ptr<int32_t>(), has_perm(perm) ? perm->data_ptr<int32_t>() : nullptr,
              size_k, size_n, out.data_ptr<int32_t>());
  return out;
}

at::Tensor awq_marlin_repack_cpu(const at::Tensor& b_q_weight, c10::SymInt size_k_s,
                                 c10::SymInt size_n_s, int64_t num_bits) {
  const int64_t size_k = size_k_s.expect_int(), size_n = size_n_s.expect_int();
  check_awq_marlin_repack_args(b_q_weight, size_k, size_n, num_bits, c10::DeviceType::CPU);
  at::Tensor out = at::empty({size_k / kTile, size_n * kTile / 8}, b_q_weight.options());
  repack_awq(b_q_weight.data_ptr<int32_t>(), size_k, size_n, out.data_ptr<int32_t>());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(w4kernels, CPU, m) {
  m.impl("marlin_repack", &marlin_repack_cpu);
  m.impl("awq_marlin_repack", &awq_marlin_repack_cpu);
}

}  // namespace w4k
