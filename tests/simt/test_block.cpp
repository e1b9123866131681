// Block- and grid-level behaviour: thread/block indexing, __syncthreads, static and dynamic
// shared memory, named barriers, cp.async group semantics, atomics, inter-block locks that need
// several blocks alive at once, launch-configuration errors.
#include <atomic>
#include <cstdlib>

#include "harness.h"

namespace {

__global__ void index_kernel(uint32_t* out) {
  const uint32_t t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const uint32_t b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const uint32_t n = blockDim.x * blockDim.y * blockDim.z;
  out[b * n + t] = (threadIdx.x | threadIdx.y << 4 | threadIdx.z << 8) |
                   (blockIdx.x | blockIdx.y << 4 | blockIdx.z << 8) << 12;
}

}  // namespace

TEST(thread_block_indices_3d) {
  const dim3 grid(3, 2, 2), block(5, 3, 2);
  std::vector<uint32_t> out(12 * 30, 0xdeadbeef);
  W4K_LAUNCH(index_kernel, grid, block, 0, nullptr, out.data());
  CHECK_EQ(cudaGetLastError(), cudaSuccess);
  for (uint32_t bz = 0; bz < 2; ++bz)
    for (uint32_t by = 0; by < 2; ++by)
      for (uint32_t bx = 0; bx < 3; ++bx)
        for (uint32_t tz = 0; tz < 2; ++tz)
          for (uint32_t ty = 0; ty < 3; ++ty)
            for (uint32_t tx = 0; tx < 5; ++tx) {
              uint32_t b = bx + 3 * (by + 2 * bz), t = tx + 5 * (ty + 3 * tz);
              CHECK_EQ(out[b * 30 + t], (tx | ty << 4 | tz << 8) | (bx | by << 4 | bz << 8) << 12);
            }
}

namespace {
// Tree reduction through static shared memory: wrong without every __syncthreads.
__global__ void reduce_kernel(const float* in, float* out) {
  __shared__ float partial[256];
  const int t = threadIdx.x;
  partial[t] = in[blockIdx.x * 256 + t];
  __syncthreads();
  for (int stride = 128; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}
}  // namespace

namespace {
__global__ void syncthreads_count_kernel(const int* pred, int* out) {
  const int t = int(threadIdx.x);
  for (int round = 0; round < 3; ++round) {  // the same barrier, reused with new predicates
    const int p = pred[round * blockDim.x + t];
    out[(round * 3 + 0) * blockDim.x + t] = __syncthreads_count(p);
    out[(round * 3 + 1) * blockDim.x + t] = __syncthreads_and(p);
    out[(round * 3 + 2) * blockDim.x + t] = __syncthreads_or(p);
  }
}
}  // namespace

TEST(syncthreads_count_and_or) {
  const int n = 96;
  std::vector<int> pred(3 * n), out(9 * n, -1);
  for (int t = 0; t < n; ++t) {
    pred[t] = t % 3 == 0 ? 5 : 0;  // 32 of 96
    pred[n + t] = 1;               // all
    pred[2 * n + t] = 0;           // none
  }
  W4K_LAUNCH(syncthreads_count_kernel, dim3(1), dim3(n), 0, nullptr, pred.data(), out.data());
  const int want[3][3] = {{32, 0, 1}, {96, 1, 1}, {0, 0, 0}};
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 3; ++k)
      for (int t = 0; t < n; ++t) CHECK_EQ(out[(r * 3 + k) * n + t], want[r][k]);
}

TEST(syncthreads_tree_reduction_static_shared) {
  const int blocks = 6;
  std::vector<float> in(256 * blocks), out(blocks);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 97);  // sums exact in float
  W4K_LAUNCH(reduce_kernel, dim3(blocks), dim3(256), 0, nullptr, in.data(), out.data());
  for (int b = 0; b < blocks; ++b) {
    double want = 0;
    for (int t = 0; t < 256; ++t) want += in[b * 256 + t];
    CHECK_EQ(double(out[b]), want);
  }
}

namespace {
// Every byte of dynamic shared memory reads 0xFF at block start, whatever the previous block
// left there; then the block overwrites it.
__global__ void smem_fill_kernel(int nbytes, int* poisoned_bytes) {
  W4K_EXTERN_SHARED(unsigned char, sh);
  int count = 0;
  for (int i = threadIdx.x; i < nbytes; i += blockDim.x) count += sh[i] == 0xFF;
  atomicAdd(poisoned_bytes, count);
  __syncthreads();
  for (int i = threadIdx.x; i < nbytes; i += blockDim.x) sh[i] = 0x11;
}
}  // namespace

TEST(dynamic_shared_memory_poisoned_at_every_block_start) {
  const int nbytes = 1000, blocks = 5;  // not a multiple of anything
  int poisoned = 0;
  W4K_LAUNCH(smem_fill_kernel, dim3(blocks), dim3(64), nbytes, nullptr, nbytes, &poisoned);
  CHECK_EQ(poisoned, nbytes * blocks);
  poisoned = 0;
  W4K_LAUNCH(smem_fill_kernel, dim3(1), dim3(64), nbytes, nullptr, nbytes, &poisoned);
  CHECK_EQ(poisoned, nbytes);
}

namespace {
// Static __shared__ stays private to each block while many blocks are alive at once: every
// block stores its id, then all blocks meet at a grid-wide barrier (which needs all of them
// alive: more blocks than worker slots), then each checks its own copy.
__global__ void grid_barrier_kernel(int* arrived, int nblocks, int* bad) {
  __shared__ int my_block[64];
  my_block[threadIdx.x] = int(blockIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(arrived, 1);
    while (w4k::ptx::ld_acquire_gpu(arrived) < nblocks) {
    }
  }
  __syncthreads();
  if (my_block[(threadIdx.x + 1) % 64] != int(blockIdx.x)) atomicAdd(bad, 1);
}
}  // namespace

TEST(static_shared_private_per_block_with_grid_barrier) {
  const int nblocks = 12;  // > default worker slots (min(4, cores))
  int arrived = 0, bad = 0;
  W4K_LAUNCH(grid_barrier_kernel, dim3(nblocks), dim3(64), 0, nullptr, &arrived, nblocks, &bad);
  CHECK_EQ(arrived, nblocks);
  CHECK_EQ(bad, 0);
}

namespace {
// Split-K style serialization in REVERSE block order: block b waits for block b+1's release,
// adds its partial, releases block b-1. Needs every block alive and acquire loads that yield.
__global__ void reverse_chain_kernel(int* lock, float* acc, int nblocks, int* order) {
  if (threadIdx.x == 0) {
    while (w4k::ptx::ld_acquire_gpu(lock) != nblocks - 1 - int(blockIdx.x)) {
    }
    order[nblocks - 1 - blockIdx.x] = int(blockIdx.x);
  }
  __syncthreads();
  acc[threadIdx.x] += float(blockIdx.x + 1);  // serialized by the lock
  __syncthreads();
  // release the next block: odd blocks store the new value, even blocks add 1 (same effect)
  if (threadIdx.x == 0) {
    if (blockIdx.x % 2)
      w4k::ptx::st_release_gpu(lock, nblocks - int(blockIdx.x));
    else
      w4k::ptx::red_release_gpu_add(lock, 1);
  }
}
}  // namespace

TEST(inter_block_lock_reverse_order_needs_concurrency) {
  const int nblocks = 10;
  int lock = 0;
  std::vector<int> order(nblocks, -1);
  std::vector<float> acc(32, 0.f);
  W4K_LAUNCH(reverse_chain_kernel, dim3(nblocks), dim3(32), 0, nullptr, &lock, acc.data(), nblocks,
             order.data());
  CHECK_EQ(lock, nblocks);
  for (int i = 0; i < nblocks; ++i) CHECK_EQ(order[i], nblocks - 1 - i);
  for (float a : acc) CHECK_EQ(a, float(nblocks * (nblocks + 1) / 2));
}

namespace {
// The same reverse chain, but every warp spins and votes in every iteration: the spinning
// threads keep reaching a collective, so "all threads only re-read" never holds for a round.
// (Wait for `lock >= me`, not `lock == me`: thread 0 may release the next block before the
// other warps have seen their turn; the reverse schedule caught that race in this test.)
__global__ void reverse_chain_vote_kernel(int* lock, int* order, int nblocks) {
  const int me = nblocks - 1 - int(blockIdx.x);
  while (__any_sync(0xffffffffu, w4k::ptx::ld_acquire_gpu(lock) < me)) {
  }
  if (threadIdx.x == 0) {
    order[me] = int(blockIdx.x);
    w4k::ptx::red_release_gpu_add(lock, 1);
  }
}

// Thread 0 polls, the block decides together through shared memory and __syncthreads: the
// other threads never spin themselves, they wait at barriers.
__global__ void reverse_chain_barrier_kernel(int* lock, int* order, int nblocks) {
  __shared__ int go;
  const int me = nblocks - 1 - int(blockIdx.x);
  for (;;) {
    if (threadIdx.x == 0) go = w4k::ptx::ld_acquire_gpu(lock) == me;
    __syncthreads();
    const bool done = go;
    __syncthreads();
    if (done) break;
  }
  if (threadIdx.x == 0) {
    order[me] = int(blockIdx.x);
    w4k::ptx::red_release_gpu_add(lock, 1);
  }
}
}  // namespace

TEST(inter_block_lock_spin_with_warp_vote_or_barriers) {
  const int nblocks = 6;
  for (auto* kernel : {&reverse_chain_vote_kernel, &reverse_chain_barrier_kernel}) {
    int lock = 0;
    std::vector<int> order(nblocks, -1);
    W4K_LAUNCH(kernel, dim3(nblocks), dim3(64), 0, nullptr, &lock, order.data(), nblocks);
    CHECK_EQ(lock, nblocks);
    for (int i = 0; i < nblocks; ++i) CHECK_EQ(order[i], nblocks - 1 - i);
  }
}

namespace {
__global__ void atomics_kernel(int* i, unsigned* u, float* f, int* mx, unsigned* orr, int* lock,
                               int* counter) {
  const int t = int(threadIdx.x + blockIdx.x * blockDim.x);
  atomicAdd(i, t);
  atomicAdd(u, 1u);
  atomicAdd(f, 0.5f);
  atomicMax(mx, (t * 37) % 101);
  atomicOr(orr, 1u << (t % 32));
  // a CAS spin lock around a non-atomic read-modify-write
  while (atomicCAS(lock, 0, 1) != 0) {
  }
  int v = *counter;
  *counter = v + 1;
  atomicExch(lock, 0);
}
}  // namespace

TEST(atomics_and_cas_spin_lock) {
  int i = 0, mx = -1, lock = 0, counter = 0;
  unsigned u = 0, orr = 0;
  float f = 0;
  const int blocks = 6, threads = 64, n = blocks * threads;
  W4K_LAUNCH(atomics_kernel, dim3(blocks), dim3(threads), 0, nullptr, &i, &u, &f, &mx, &orr, &lock,
             &counter);
  CHECK_EQ(i, n * (n - 1) / 2);
  CHECK_EQ(u, unsigned(n));
  CHECK_EQ(f, 0.5f * n);
  CHECK_EQ(mx, 100);
  CHECK_EQ(orr, 0xffffffffu);
  CHECK_EQ(counter, n);
  CHECK_EQ(lock, 0);
}

namespace {
// Warps 0-1 and warps 2-3 synchronize on different named barriers, at different call sites.
__global__ void named_barrier_kernel(int* out) {
  __shared__ int vals[128];
  const int t = threadIdx.x;
  vals[t] = t * 3;
  if (t < 64) {
    w4k::ptx::barrier_sync(1, 64);
    out[t] = vals[63 - t];
  } else {
    w4k::ptx::barrier_sync(2, 64);
    out[t] = vals[64 + 127 - t];
  }
}
}  // namespace

TEST(named_barriers_bar_sync_with_count) {
  std::vector<int> out(128);
  W4K_LAUNCH(named_barrier_kernel, dim3(1), dim3(128), 0, nullptr, out.data());
  for (int t = 0; t < 64; ++t) CHECK_EQ(out[t], (63 - t) * 3);
  for (int t = 64; t < 128; ++t) CHECK_EQ(out[t], (191 - t) * 3);
}

namespace {
// Reads shared memory that may still be ASan-poisoned by an in-flight cp.async (this test looks
// at in-flight data on purpose; kernels must not).
__attribute__((no_sanitize("address"))) int4 peek(const int4* p) {
  const volatile int* w = reinterpret_cast<const volatile int*>(p);
  return make_int4(w[0], w[1], w[2], w[3]);
}

// One thread, three committed groups plus one uncommitted copy; after each wait the test
// records which destinations hold data (1), poison (0xFF bytes: 2) or anything else (3).
__global__ void cp_async_groups_kernel(const int4* src, int* state) {
  W4K_EXTERN_SHARED(int4, sh);
  if (threadIdx.x != 0) return;
  sh[5] = make_int4(7, 7, 7, 7);
  auto classify = [&](int k) {
    const int4 v = peek(&sh[k]);
    if (v.x == src[k].x && v.y == src[k].y && v.z == src[k].z && v.w == src[k].w) return 1;
    if (v.x == -1 && v.y == -1 && v.z == -1 && v.w == -1) return 2;
    return 3;
  };
  auto snapshot = [&](int row) {
    for (int k = 0; k < 6; ++k) state[row * 6 + k] = classify(k);
  };
  w4k::ptx::cp_async16_cg(&sh[0], &src[0]);
  w4k::ptx::cp_async_commit_group();  // group A
  w4k::ptx::cp_async16_ca(&sh[1], &src[1]);
  w4k::ptx::cp_async4_ca(&sh[2].x, &src[2].x);
  w4k::ptx::cp_async4_ca(&sh[2].y, &src[2].y);
  w4k::ptx::cp_async4_ca(&sh[2].z, &src[2].z);
  w4k::ptx::cp_async4_ca(&sh[2].w, &src[2].w);
  w4k::ptx::cp_async_commit_group();                      // group B
  w4k::ptx::cp_async16_cg_zfill(&sh[3], &src[3], false);  // 16 zero bytes
  w4k::ptx::cp_async16_cg_pred(&sh[5], &src[5], false);   // no copy at all
  w4k::ptx::cp_async_commit_group();                      // group C
  w4k::ptx::cp_async16_cg_zfill(&sh[4], &src[4], true);   // uncommitted
  snapshot(0);
  w4k::ptx::cp_async_wait_group<2>();  // A done
  snapshot(1);
  w4k::ptx::cp_async_wait_group<1>();  // B done
  snapshot(2);
  w4k::ptx::cp_async_wait_group<0>();  // C done, the uncommitted copy still pending
  snapshot(3);
  w4k::ptx::cp_async_wait_all();  // commits it and waits
  snapshot(4);
  state[30] = sh[3].x == 0 && sh[3].y == 0 && sh[3].z == 0 && sh[3].w == 0;
  state[31] = sh[5].x == 7 && sh[5].w == 7;
}
}  // namespace

TEST(cp_async_commit_wait_group_semantics) {
  std::vector<int4> src(6);
  for (int k = 0; k < 6; ++k) src[k] = make_int4(k * 4 + 1, k * 4 + 2, k * 4 + 3, k * 4 + 4);
  std::vector<int> state(32, -1);
  W4K_LAUNCH(cp_async_groups_kernel, dim3(1), dim3(32), 6 * 16, nullptr, src.data(), state.data());
  // columns: sh[0] (A), sh[1] (B), sh[2] (B, 4-byte), sh[3] (C, zfill), sh[4] (uncommitted),
  // sh[5] (predicated off: keeps 7s, classified 3)
  const int want[5][6] = {{2, 2, 2, 2, 2, 3},
                          {1, 2, 2, 2, 2, 3},
                          {1, 1, 1, 2, 2, 3},
                          {1, 1, 1, 3, 2, 3},
                          {1, 1, 1, 3, 1, 3}};
  for (int r = 0; r < 5; ++r)
    for (int k = 0; k < 6; ++k)
      if (state[r * 6 + k] != want[r][k])
        harness::fail(__FILE__, __LINE__,
                      "after wait step " + std::to_string(r) + ", sh[" + std::to_string(k) +
                          "] state " + std::to_string(state[r * 6 + k]) + " want " +
                          std::to_string(want[r][k]));
  CHECK_EQ(state[30], 1);
  CHECK_EQ(state[31], 1);
}

namespace {
__global__ void big_smem_kernel(int* out) {
  W4K_EXTERN_SHARED(int, sh);
  sh[threadIdx.x * 1000] = int(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = sh[((threadIdx.x + 1) % 32) * 1000];
}
__global__ void noop_kernel(int) {}
__global__ void throwing_kernel(int bad_thread) {
  if (int(threadIdx.x) == bad_thread) throw std::runtime_error("kernel-side failure");
}
}  // namespace

TEST(launch_configuration_errors_like_cuda) {
  W4K_LAUNCH(noop_kernel, dim3(1), dim3(2048), 0, nullptr, 0);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  CHECK_EQ(cudaGetLastError(), cudaSuccess);  // reading clears it
  W4K_LAUNCH(noop_kernel, dim3(0), dim3(32), 0, nullptr, 0);
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // more than 48 KiB of dynamic shared memory needs the opt-in attribute, as on the GPU
  std::vector<int> out(32);
  const size_t smem = 32 * 1000 * 4;
  W4K_LAUNCH(big_smem_kernel, dim3(1), dim3(32), smem, nullptr, out.data());
  CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_EQ(
      cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
      cudaSuccess);
  W4K_LAUNCH(big_smem_kernel, dim3(1), dim3(32), smem, nullptr, out.data());
  CHECK_EQ(cudaGetLastError(), cudaSuccess);
  for (int t = 0; t < 32; ++t) CHECK_EQ(out[t], (t + 1) % 32);
  CHECK_EQ(
      cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 1 << 20),
      cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST(kernel_exception_propagates_to_launcher) {
  try {
    W4K_LAUNCH(throwing_kernel, dim3(2), dim3(64), 0, nullptr, 40);
  } catch (const std::runtime_error& e) {
    CHECK_CONTAINS(e.what(), "kernel-side failure");
    return;
  }
  throw harness::Failure("no exception");
}

namespace {
// Deep stack use per thread (64 KiB local array): fiber stacks must hold it.
__global__ void stack_kernel(int* out) {
  volatile int local[16384];
  for (int i = 0; i < 16384; ++i) local[i] = i * int(threadIdx.x);
  __syncthreads();
  int s = 0;
  for (int i = 0; i < 16384; i += 1000) s += local[i];
  out[threadIdx.x] = s;
}
}  // namespace

TEST(fiber_stacks_hold_large_locals) {
  std::vector<int> out(64);
  W4K_LAUNCH(stack_kernel, dim3(2), dim3(64), 0, nullptr, out.data());
  int base = 0;
  for (int i = 0; i < 16384; i += 1000) base += i;
  for (int t = 0; t < 64; ++t) CHECK_EQ(out[t], base * t);
}

namespace {
// Missing __syncthreads: thread t reads what thread t-1 wrote. The default forward order runs
// t-1 first and hides the race; the reverse and shuffled orders read the poison fill.
__global__ void missing_barrier_kernel(float* out) {
  W4K_EXTERN_SHARED(float, sh);
  const int t = int(threadIdx.x);
  sh[t] = float(t);
  out[t] = sh[t > 0 ? t - 1 : 0];
}
int nan_count(const char* schedule) {
  setenv("W4K_SIMT_SCHEDULE", schedule, 1);
  std::vector<float> out(64, 0.f);
  W4K_LAUNCH(missing_barrier_kernel, dim3(1), dim3(64), 64 * sizeof(float), nullptr, out.data());
  unsetenv("W4K_SIMT_SCHEDULE");
  int nans = 0;
  for (float x : out) nans += std::isnan(x);
  return nans;
}
}  // namespace

TEST(schedule_orders_expose_missing_syncthreads) {
  CHECK_EQ(nan_count("forward"), 0);
  CHECK_EQ(nan_count("reverse"), 63);
  CHECK(nan_count("shuffle") > 0);
  std::string msg;
  setenv("W4K_SIMT_SCHEDULE", "sideways", 1);
  try {
    nan_count("sideways");
  } catch (const std::invalid_argument& e) {
    msg = e.what();
  }
  unsetenv("W4K_SIMT_SCHEDULE");
  CHECK_CONTAINS(msg, "W4K_SIMT_SCHEDULE must be forward, reverse or shuffle, got 'sideways'");
}
