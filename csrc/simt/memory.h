// Memory operations of the SIMT emulator: cp.async with exact commit/wait group semantics,
// acquire/release accesses and atomics on host std::atomic-equivalent builtins.
#pragma once

#include <atomic>
#include <cstring>

#include "simt/runtime.h"

namespace simt {

// cp.async.{ca,cg}.shared.global [dst], [src], size[, src_size]. The source is read at issue
// (so an out-of-bounds source is reported at the faulting instruction); the destination is
// filled with poison now and receives the data only at the cp.async.wait_group that retires
// the copy's group. Under ASan the 16-byte destinations are also ASan-poisoned until then, so
// reading them early is reported as use-after-poison.
inline void cp_async(const char* name, void* dst, const void* src, int size, bool zero_fill) {
  Fiber& f = current();
  check_shared_address(name, dst, size_t(size));
  if (!zero_fill && reinterpret_cast<uintptr_t>(src) % size)
    fail_here(std::string(name) + ": global address " + ptr_str(src) + " is not " +
              std::to_string(size) + "-byte aligned");
  AsyncCopy c;
  c.dst = dst;
  c.size = size;
  if (zero_fill)
    std::memset(c.data, 0, sizeof c.data);
  else
    std::memcpy(c.data, src, size_t(size));
  std::memset(dst, kPoisonByte, size_t(size));
#if W4K_SIMT_ASAN
  if (size == 16) __asan_poison_memory_region(dst, 16);
#endif
  f.cp_open.push_back(c);
}

// cp.async.commit_group: everything issued since the previous commit forms one group (possibly
// empty).
inline void cp_async_commit() {
  Fiber& f = current();
  f.cp_groups.emplace_back(std::move(f.cp_open));
  f.cp_open.clear();
}

// cp.async.wait_group n: wait until at most n of the most recent committed groups are pending.
// Copies not yet committed are not waited for.
inline void cp_async_wait(int n) {
  Fiber& f = current();
  while (int(f.cp_groups.size()) > n) {
    std::vector<AsyncCopy> group = std::move(f.cp_groups.front());
    f.cp_groups.erase(f.cp_groups.begin());
    const AsyncCopy* raced = nullptr;
    for (AsyncCopy& c : group)  // land all of them first: nothing stays ASan-poisoned
      if (!land(c) && !raced) raced = &c;
    if (raced) {
      const AsyncCopy& c = *raced;
      fail_here("cp.async.wait_group: the " + std::to_string(c.size) + "-byte destination " +
                ptr_str(c.dst) +
                " was written while its cp.async was in flight (race with "
                "the asynchronous copy)");
    }
  }
}

// ---- acquire / release / atomics ----
// GPU-scope memory operations map to std::atomic_ref on the host (blocks run on different OS
// threads). Loads with acquire semantics and all atomics yield the fiber first: this is what
// lets a thread spinning on a flag (split-K locks) give way to the thread or block that will
// set it.
__attribute__((noinline)) inline int ld_acquire(const int* p) {
  const void* site = __builtin_return_address(0);
  spin_yield(site);
  const int v = std::atomic_ref<int>(*const_cast<int*>(p)).load(std::memory_order_acquire);
  spin_observe(site, uint32_t(v));
  return v;
}

// Release operations need no yield: nothing waits on the releasing thread itself.
inline void red_release_add(int* p, int v) {
  std::atomic_ref<int>(*p).fetch_add(v, std::memory_order_release);
}
inline void st_release(int* p, int v) {
  std::atomic_ref<int>(*p).store(v, std::memory_order_release);
}

// atomicAdd & co: old = *p; *p = op(old) atomically (sequentially consistent); returns old.
template <class T, class Op>
inline T atomic_rmw(T* p, Op op, const void* site) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32/64-bit atomics");
  spin_yield(site);
  std::atomic_ref<T> ref(*p);
  T old = ref.load(std::memory_order_relaxed);
  while (!ref.compare_exchange_weak(old, op(old), std::memory_order_seq_cst,
                                    std::memory_order_relaxed)) {
  }
  uint64_t bits = 0;
  std::memcpy(&bits, &old, sizeof(T));
  spin_observe(site, bits);
  return old;
}

}  // namespace simt
