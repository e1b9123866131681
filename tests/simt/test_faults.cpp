// Deliberate bugs the emulator must catch. Each emulator fault is a simt::Error naming block,
// thread, warp and lane. The two memory bugs are run by tests/test_simt_emulator.py in their own
// processes: bug_missing_cp_async_wait (poison in the result; under ASan a use-after-poison
// report) and bug_shared_memory_overflow (ASan heap-buffer-overflow report).
#include <cstdlib>

#include "harness.h"

using harness::check_names_location;
using harness::simt_error_of;

namespace {

__global__ void divergent_mma_kernel(float* out) {
  uint32_t a[4] = {0x3c003c00u, 0, 0, 0}, b[2] = {0x3c003c00u, 0}, a2[4] = {0, 0, 0, 0};
  float c[4] = {0, 0, 0, 0};
  if (threadIdx.x < 16)
    w4k::ptx::mma_m16n8k16_f16f32(a, b, c);
  else
    w4k::ptx::mma_m16n8k16_f16f32(a2, b, c);  // same instruction, different call site
  out[threadIdx.x] = c[0];
}

}  // namespace

TEST(bug_divergent_mma_names_warp_and_lane) {
  std::vector<float> out(64);
  std::string msg = simt_error_of(
      [&] { W4K_LAUNCH(divergent_mma_kernel, dim3(2), dim3(64), 0, nullptr, out.data()); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "divergent mma.m16n8k16");
  CHECK_CONTAINS(msg, "call site");
  CHECK_CONTAINS(msg, "lanes 0x0000ffff");   // lanes 0-15 wait at the other site
  CHECK_CONTAINS(msg, "[warp 0, lane 16]");  // the first lane arriving elsewhere is named
}

namespace {
__global__ void divergent_mask_kernel(int* out) {
  const unsigned mask = threadIdx.x == 5 ? 0x0000ffffu : 0xffffffffu;
  out[threadIdx.x] = __shfl_xor_sync(mask, int(threadIdx.x), 1);
}
}  // namespace

TEST(bug_divergent_member_masks) {
  std::vector<int> out(32);
  std::string msg = simt_error_of(
      [&] { W4K_LAUNCH(divergent_mask_kernel, dim3(1), dim3(32), 0, nullptr, out.data()); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "divergent __shfl_xor_sync");
  CHECK_CONTAINS(msg, "member mask 0x0000ffff");
  CHECK_CONTAINS(msg, "[warp 0, lane 5]");
}

namespace {
// Thread 7 skips the only __syncthreads and exits: the others would wait forever.
__global__ void skipped_syncthreads_kernel(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = int(threadIdx.x);
  if (threadIdx.x != 7) __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}
// Thread 7 skips the first of two __syncthreads: it reaches the second one while the others
// wait at the first (the GPU would silently mismatch them).
__global__ void skipped_first_syncthreads_kernel(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = int(threadIdx.x);
  if (threadIdx.x != 7) __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
  __syncthreads();
  s[threadIdx.x] = 0;
}
// Lane 0 waits in a shuffle for lane 1, which waits at __syncthreads for lane 0: nobody can move.
__global__ void true_deadlock_kernel(int* out) {
  int v = int(threadIdx.x);
  if (threadIdx.x == 1) __syncthreads();
  v = __shfl_sync(0xffffffffu, v, 0);
  if (threadIdx.x != 1) __syncthreads();
  out[threadIdx.x] = v;
}
}  // namespace

TEST(bug_deadlock_skipped_syncthreads) {
  std::vector<int> out(64);
  std::string msg = simt_error_of(
      [&] { W4K_LAUNCH(skipped_syncthreads_kernel, dim3(1), dim3(64), 0, nullptr, out.data()); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "deadlock");
  CHECK_CONTAINS(msg, "thread (7,0,0) [warp 0, lane 7]");  // the thread that exited

  msg = simt_error_of([&] {
    W4K_LAUNCH(skipped_first_syncthreads_kernel, dim3(1), dim3(64), 0, nullptr, out.data());
  });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "divergent __syncthreads");
  CHECK_CONTAINS(msg, "thread (7,0,0)");

  msg = simt_error_of(
      [&] { W4K_LAUNCH(true_deadlock_kernel, dim3(1), dim3(32), 0, nullptr, out.data()); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "deadlock in block (0,0,0): every live thread is blocked");
  CHECK_CONTAINS(msg, "lane 1] waits in __syncthreads");
  CHECK_CONTAINS(msg, "lane 0] waits in __shfl_sync");
}

namespace {
// Lane 31 returns while lanes 0-30 wait for it in a full-mask shuffle.
__global__ void exit_mid_collective_kernel(int* out) {
  if (threadIdx.x == 31) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, int(threadIdx.x), 1);
}
// Lane 0 has returned before the others name it in their mask.
__global__ void collective_with_exited_lane_kernel(int* out) {
  if (threadIdx.x == 0) return;
  out[threadIdx.x] = int(__ballot_sync(0xffffffffu, 1));
}
}  // namespace

TEST(bug_lane_exits_mid_collective) {
  std::vector<int> out(32);
  std::string msg = simt_error_of(
      [&] { W4K_LAUNCH(exit_mid_collective_kernel, dim3(1), dim3(32), 0, nullptr, out.data()); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "lane exited in the middle of __shfl_down_sync");
  CHECK_CONTAINS(msg, "[warp 0, lane 31]");
  msg = simt_error_of([&] {
    W4K_LAUNCH(collective_with_exited_lane_kernel, dim3(1), dim3(32), 0, nullptr, out.data());
  });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "naming exited lanes 0x00000001");
}

namespace {
__global__ void misaligned_ldmatrix_kernel(int bad_lane, int use_local) {
  W4K_EXTERN_SHARED(uint4, sh);
  uint4 local[2] = {};
  const char* p = reinterpret_cast<const char*>(&sh[threadIdx.x % 8]);
  if (int(threadIdx.x) == bad_lane) p += use_local ? 0 : 8;
  if (use_local && int(threadIdx.x) == bad_lane) p = reinterpret_cast<const char*>(&local[0]);
  uint32_t r[4];
  w4k::ptx::ldmatrix_x4(r, p);
}
}  // namespace

TEST(bug_misaligned_or_non_shared_ldmatrix) {
  std::string msg = simt_error_of(
      [&] { W4K_LAUNCH(misaligned_ldmatrix_kernel, dim3(1), dim3(32), 8 * 16, nullptr, 13, 0); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "not 16-byte aligned");
  CHECK_CONTAINS(msg, "[warp 0, lane 13]");
  msg = simt_error_of(
      [&] { W4K_LAUNCH(misaligned_ldmatrix_kernel, dim3(1), dim3(32), 8 * 16, nullptr, 22, 1); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "local memory");
  CHECK_CONTAINS(msg, "[warp 0, lane 22]");
}

namespace {
__global__ void shfl_outside_mask_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, int(threadIdx.x), 20);
}
}  // namespace

TEST(bug_shfl_reads_lane_outside_mask) {
  std::vector<int> out(32);
  std::string msg = simt_error_of(
      [&] { W4K_LAUNCH(shfl_outside_mask_kernel, dim3(1), dim3(32), 0, nullptr, out.data()); });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "reads lane 20 which is not in the member mask");
}

namespace {
__global__ void spin_forever_kernel(int* flag) {
  if (threadIdx.x == 0)
    while (w4k::ptx::ld_acquire_gpu(flag) == 0) {
    }
}
}  // namespace

TEST(bug_spin_without_release_times_out) {
  setenv("W4K_SIMT_SPIN_TIMEOUT_S", "1", 1);
  int flag = 0;
  std::string msg =
      simt_error_of([&] { W4K_LAUNCH(spin_forever_kernel, dim3(2), dim3(32), 0, nullptr, &flag); });
  unsetenv("W4K_SIMT_SPIN_TIMEOUT_S");
  check_names_location(msg);
  CHECK_CONTAINS(msg, "spin timeout");
}

namespace {
// Loads a tile with cp.async, commits, and (bug) never waits before using it.
template <bool wait>
__global__ void cp_async_sum_kernel(const float4* src, float* out) {
  W4K_EXTERN_SHARED(float4, sh);
  w4k::ptx::cp_async16_cg(&sh[threadIdx.x], &src[threadIdx.x]);
  w4k::ptx::cp_async_commit_group();
  if (wait) w4k::ptx::cp_async_wait_group<0>();
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (int i = 0; i < 32; ++i) s += sh[i].x + sh[i].y + sh[i].z + sh[i].w;
    *out = s;
  }
}
float cp_async_sum(bool wait) {
  std::vector<float4> src(32, make_float4(1, 2, 3, 4));
  float out = 0;
  auto* k = wait ? &cp_async_sum_kernel<true> : &cp_async_sum_kernel<false>;
  W4K_LAUNCH(k, dim3(1), dim3(32), 32 * 16, nullptr, src.data(), &out);
  return out;
}
}  // namespace

// Without ASan: the sum is NaN (the destination holds poison until the wait). With ASan the
// first read of the unwaited data is reported as use-after-poison (the pytest expects that).
TEST(bug_missing_cp_async_wait) {
  CHECK_EQ(cp_async_sum(true), 320.f);
  CHECK(std::isnan(cp_async_sum(false)));
}

namespace {
// A plain store hits a cp.async destination before the wait (the ASan build would report the
// store itself as use-after-poison; the test stores around ASan to check the emulator's own
// detection, which works in every build).
__attribute__((no_sanitize("address"))) void racing_store(int* p) { *p = 42; }
__global__ void store_races_cp_async_kernel(const int4* src) {
  W4K_EXTERN_SHARED(int4, sh);
  w4k::ptx::cp_async16_cg(&sh[threadIdx.x], &src[threadIdx.x]);
  w4k::ptx::cp_async_commit_group();
  if (threadIdx.x == 3) racing_store(&sh[3].y);
  w4k::ptx::cp_async_wait_group<0>();
}
}  // namespace

TEST(bug_store_races_in_flight_cp_async) {
  std::vector<int4> src(32, make_int4(1, 2, 3, 4));
  std::string msg = simt_error_of([&] {
    W4K_LAUNCH(store_races_cp_async_kernel, dim3(1), dim3(32), 32 * 16, nullptr, src.data());
  });
  check_names_location(msg);
  CHECK_CONTAINS(msg, "was written while its cp.async was in flight");
  CHECK_CONTAINS(msg, "[warp 0, lane 3]");
}

namespace {
__global__ void smem_overflow_kernel(int n) {
  W4K_EXTERN_SHARED(float, sh);
  sh[threadIdx.x] = 1.0f;  // thread n writes one float past the n floats launched
  (void)n;
}
}  // namespace

// Only meaningful under ASan (dynamic shared memory is a heap block of exactly the launch size):
// the pytest expects a heap-buffer-overflow report naming this kernel.
TEST(bug_shared_memory_overflow) {
  const int n = 31;
  W4K_LAUNCH(smem_overflow_kernel, dim3(1), dim3(n + 1), n * sizeof(float), nullptr, n);
}
