// Grid launch for the SIMT emulator, and the small CUDA runtime API surface launchers use.
#pragma once

#include <cstdlib>
#include <map>
#include <tuple>

#include "simt/runtime.h"

namespace simt {

// Launch-configuration errors are reported like CUDA does: through cudaGetLastError().
inline thread_local cudaError_t tl_last_error = cudaSuccess;

// Emulated device limits (sm_80: 163 KiB opt-in dynamic shared memory per block).
inline int max_smem_optin() { return env_int("W4K_SIMT_MAX_SMEM_OPTIN", 166912); }
inline int num_sms() { return env_int("W4K_SIMT_SMS", 8); }
inline int num_workers() {
  int hw = int(std::thread::hardware_concurrency());
  int n = env_int("W4K_SIMT_WORKERS", std::min(4, std::max(1, hw)));
  return std::max(1, n);
}

// W4K_SIMT_SCHEDULE=forward (default) | reverse | shuffle: thread order within a block.
inline int schedule_from_env() {
  const char* v = std::getenv("W4K_SIMT_SCHEDULE");
  if (!v || !*v || std::strcmp(v, "forward") == 0) return 0;
  if (std::strcmp(v, "reverse") == 0) return 1;
  if (std::strcmp(v, "shuffle") == 0) return 2;
  throw std::invalid_argument(std::string("W4K_SIMT_SCHEDULE must be forward, reverse or ") +
                              "shuffle, got '" + v + "'");
}

struct FuncAttributes {
  std::mutex mu;
  std::map<const void*, int> max_dynamic_smem;
  static FuncAttributes& get() {
    static FuncAttributes* a = new FuncAttributes();
    return *a;
  }
  int dynamic_smem_limit(const void* fn) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = max_dynamic_smem.find(fn);
    return it == max_dynamic_smem.end() ? 48 * 1024 : it->second;
  }
};

inline void Block::release_resources() {
  for (int t = 0; t < nthreads; ++t) {
#if W4K_SIMT_ASAN
    for (auto& g : fibers[t].cp_groups)
      for (auto& c : g)
        if (c.size == 16) __asan_unpoison_memory_region(c.dst, 16);
    for (auto& c : fibers[t].cp_open)
      if (c.size == 16) __asan_unpoison_memory_region(c.dst, 16);
#endif
    StackPool::get().give(fibers[t].stack);
    fibers[t].stack = Stack{};
  }
  std::free(smem);
  smem = nullptr;
}

// Runs block `linear` (x fastest) of the grid on the calling OS thread.
inline void run_block(Launch& L, int64_t linear, bool& holds_permit) {
  Block b;
  b.launch = &L;
  b.grid_dim = L.grid;
  b.block_dim = L.block;
  b.block_idx = uint3{unsigned(linear % L.grid.x), unsigned((linear / L.grid.x) % L.grid.y),
                      unsigned(linear / (int64_t(L.grid.x) * L.grid.y))};
  b.nthreads = int(L.block.x * L.block.y * L.block.z);
  // Dynamic shared memory: exactly the launch size (ASan redzones right behind it), 128-byte
  // aligned like the GPU's, poisoned at block start.
  b.smem_bytes = L.smem_bytes;
  void* p = nullptr;
  if (posix_memalign(&p, 128, L.smem_bytes) != 0 || (!p && L.smem_bytes))
    throw std::runtime_error("simt: cannot allocate " + std::to_string(L.smem_bytes) +
                             " bytes of dynamic shared memory");
  b.smem = static_cast<unsigned char*>(p);
  std::memset(b.smem, kPoisonByte, L.smem_bytes);
  const int nwarps = (b.nthreads + 31) / 32;
  b.warps.resize(size_t(nwarps));
  for (int w = 0; w < nwarps; ++w) {
    int lanes = std::min(32, b.nthreads - 32 * w);
    b.warps[size_t(w)].valid = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
  }
  b.fibers.reset(new Fiber[size_t(b.nthreads)]);
  try {
    for (int t = 0; t < b.nthreads; ++t) {
      Fiber& f = b.fibers[t];
      f.block = &b;
      f.tid = t;
      f.thread_idx = uint3{unsigned(t % L.block.x), unsigned((t / L.block.x) % L.block.y),
                           unsigned(t / (L.block.x * L.block.y))};
      f.warp = t / 32;
      f.lane = t % 32;
      f.stack = StackPool::get().take();
      make_context(f.ctx, f.stack, &fiber_main, &f);
      auto lo = reinterpret_cast<uintptr_t>(f.stack.base);
      b.stack_ranges.emplace_back(lo, lo + f.stack.total);
    }
    std::sort(b.stack_ranges.begin(), b.stack_ranges.end());
    tl_block = &b;
    b.run();
    if (b.error) std::rethrow_exception(b.error);
  } catch (...) {
    L.fail(std::current_exception());
  }
  tl_block = nullptr;
  holds_permit = b.holds_permit;
  b.release_resources();
}

inline void block_thread(Launch* L, int64_t linear) {
  bool holds_permit = true;
  try {
    run_block(*L, linear, holds_permit);
  } catch (...) {
    L->fail(std::current_exception());
  }
  std::lock_guard<std::mutex> lock(L->mu);
  if (holds_permit) L->release_permit_locked();
  --L->alive;
  L->cv.notify_all();
}

// Runs every block, each on a fresh OS thread (so static __shared__, which is thread_local,
// is private to the block and starts zeroed), at most num_workers() at a time.
inline void run_grid(Launch& L) {
  L.permits = num_workers();
  for (int64_t b = 0; b < L.nblocks; ++b) {
    if (!L.acquire_permit()) break;
    {
      std::lock_guard<std::mutex> lock(L.mu);
      ++L.alive;
    }
    try {
      std::thread(&block_thread, &L, b).detach();
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(L.mu);
        --L.alive;
        L.release_permit_locked();
      }
      L.fail(std::current_exception());
      break;
    }
  }
  std::unique_lock<std::mutex> lock(L.mu);
  L.cv.wait(lock, [&] { return L.alive == 0; });
  if (L.error) std::rethrow_exception(L.error);
}

inline bool valid_config(dim3 grid, dim3 block, size_t smem, const void* fn) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    tl_last_error = cudaErrorInvalidConfiguration;
    return false;
  }
  if (smem > size_t(FuncAttributes::get().dynamic_smem_limit(fn))) {
    tl_last_error = cudaErrorInvalidValue;
    return false;
  }
  return true;
}

// kernel<<<grid, block, smem>>>(args...), synchronously. Each CUDA thread calls the kernel with
// its own copy of the arguments, converted to the kernel's parameter types like a real launch.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
  if (!valid_config(grid, block, smem, reinterpret_cast<const void*>(kernel))) return;
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  Launch L;
  L.body = [kernel, &params] { std::apply(kernel, params); };
  L.grid = grid;
  L.block = block;
  L.smem_bytes = smem;
  L.nblocks = int64_t(grid.x) * grid.y * grid.z;
  L.spin_timeout_s = env_int("W4K_SIMT_SPIN_TIMEOUT_S", 30);
  L.schedule = schedule_from_env();
  L.seed = env_int("W4K_SIMT_SEED", 0);
  run_grid(L);
}

}  // namespace simt

// ---- CUDA runtime API used by launchers ----
inline cudaError_t cudaGetLastError() {
  cudaError_t e = simt::tl_last_error;
  simt::tl_last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return simt::tl_last_error; }
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    default:
      return "unspecified launch failure";
  }
}
template <class F>
inline cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      value > simt::max_smem_optin())
    return simt::tl_last_error = cudaErrorInvalidValue;
  auto& a = simt::FuncAttributes::get();
  std::lock_guard<std::mutex> lock(a.mu);
  a.max_dynamic_smem[reinterpret_cast<const void*>(fn)] = value;
  return cudaSuccess;
}
// Blocks of `fn` one SM holds at once, modelled on sm_80 limits: 2048 threads, 32 blocks and
// the opt-in shared memory per SM (registers are not modelled: nothing compiled here has a
// register count). The emulator itself runs W4K_SIMT_WORKERS blocks at a time whatever this says.
template <class F>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, F* fn,
                                                                 int block_size, size_t smem) {
  if (block_size <= 0 || block_size > 1024 ||
      smem > size_t(simt::FuncAttributes::get().dynamic_smem_limit(
                 reinterpret_cast<const void*>(fn))))
    return simt::tl_last_error = cudaErrorInvalidValue;
  int blocks = 2048 / block_size;
  if (blocks > 32) blocks = 32;
  if (smem > 0 && size_t(blocks) * smem > size_t(simt::max_smem_optin()))
    blocks = int(size_t(simt::max_smem_optin()) / smem);
  *num_blocks = blocks;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* dev) {
  *dev = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int /*device*/) {
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 * 1024;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = simt::num_sms();
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 8;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = simt::max_smem_optin();
      break;
    default:
      return simt::tl_last_error = cudaErrorInvalidValue;
  }
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind,
                                   cudaStream_t = nullptr) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
