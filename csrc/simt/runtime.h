// SIMT emulator core: blocks of fibers, the per-block scheduler, barriers, warp rendezvous and
// the grid launcher. Design notes are in simt/simt.h.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "simt/cuda_types.h"
#include "simt/fiber.h"

namespace simt {

// Every fault the emulator detects. what() names block, thread, warp and lane.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

struct Block;
struct Launch;

// Shared memory bytes written by cp.async before the data has landed and by the block-start
// fill of dynamic shared memory: 0xFF makes every fp16/bf16/fp32 lane a NaN and every integer -1.
constexpr unsigned char kPoisonByte = 0xFF;

// A cp.async in flight: the source bytes are captured at issue, they land at wait_group.
struct AsyncCopy {
  void* dst;
  int size;
  unsigned char data[16];
};

enum class FiberState { Ready, Waiting, Done };
enum class StopReason { None, Blocked, SpinYield };

struct Fiber {
  Context ctx;
  Stack stack;
  Block* block = nullptr;
  int tid = 0;  // linear thread index x + y*Dx + z*Dx*Dy
  uint3 thread_idx{0, 0, 0};
  int warp = 0, lane = 0;
  FiberState state = FiberState::Ready;
  StopReason stop = StopReason::None;
  // what a Waiting fiber waits for (diagnostics only, formatted on deadlock)
  const char* wait_name = nullptr;  // "__syncthreads", "bar.sync", "__shfl_sync", ...
  const void* wait_site = nullptr;
  uint32_t wait_mask = 0;  // collectives: member mask
  int wait_barrier = -1;   // barriers: id
  // spin detection: the last acquire-style load (site, value) and how often it repeated
  const void* spin_site = nullptr;
  uint64_t spin_value = 0;
  int spin_streak = 0;
  bool spin_repeat = false;
  // cp.async: copies issued since the last commit, then committed groups oldest first
  std::vector<AsyncCopy> cp_open;
  std::vector<std::vector<AsyncCopy>> cp_groups;  // few: erase at the front is fine
};

struct Barrier {
  int expected = 0;
  int arrived = 0;
  const void* site = nullptr;  // __syncthreads: call site of the first arrival
  bool syncthreads = false;
  std::vector<int> waiters;
  int pred_count = 0;  // __syncthreads_count/and/or: nonzero predicates of this round
  int last_count = 0;  // ... of the round that completed last (read by the released threads)
};

// A warp collective being assembled: lanes in `mask` arrive one by one at the same call site;
// the last one computes every lane's result.
struct Rendezvous;
using CollectiveFn = void (*)(Block& b, int warp, Rendezvous& r);
struct Rendezvous {
  uint32_t mask = 0;
  uint32_t arrived = 0;
  CollectiveFn fn = nullptr;
  const char* name = "";
  const void* site = nullptr;  // nullptr: any call site may join (__syncwarp)
  const void* in[32] = {};
  void* out[32] = {};
};

struct WarpState {
  uint32_t valid = 0;   // lanes that exist (a last partial warp has fewer)
  uint32_t exited = 0;  // lanes whose thread returned
  std::vector<Rendezvous> pending;
};

// Where a thread is, for messages: "block (1,0,0), thread (37,0,0) [warp 1, lane 5]".
inline std::string where(uint3 block_idx, uint3 thread_idx, int warp, int lane) {
  std::ostringstream os;
  os << "block (" << block_idx.x << "," << block_idx.y << "," << block_idx.z << "), thread ("
     << thread_idx.x << "," << thread_idx.y << "," << thread_idx.z << ") [warp " << warp
     << ", lane " << lane << "]";
  return os.str();
}

inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
inline std::string ptr_str(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
// A return address as "0x7f..2a (kernel_name+0x2a, /path/lib.so+0x1f29)". The object-relative
// offset is one byte back, inside the call instruction, so that
// `addr2line -f -C -i -e /path/lib.so 0x1f29` names the calling source line (needs -g / -g1).
inline std::string site_str(const void* site) {
  std::string s = ptr_str(site);
  Dl_info info;
  if (site && dladdr(site, &info) && info.dli_fname) {
    char buf[64];
    s += " (";
    if (info.dli_sname) {
      s += info.dli_sname;
      std::snprintf(buf, sizeof buf, "+0x%lx, ",
                    (unsigned long)((const char*)site - (const char*)info.dli_saddr));
      s += buf;
    }
    std::snprintf(buf, sizeof buf, "+0x%lx)",
                  (unsigned long)((const char*)site - (const char*)info.dli_fbase) - 1);
    s += info.dli_fname;
    s += buf;
  }
  return s;
}

inline thread_local Fiber* tl_fiber = nullptr;  // the running CUDA thread (null in the scheduler)
struct Block;
inline thread_local Block* tl_block = nullptr;  // the block this OS thread runs (diagnostics)

// The grid being run: blocks are handed to fresh OS threads, at most `permits` of them running
// at once; a block whose threads only spin gives its permit back so that other blocks (possibly
// the ones it waits for) get to run.
struct Launch {
  std::function<void()> body;  // calls the kernel with this thread's copy of the arguments
  dim3 grid, block;
  size_t smem_bytes = 0;
  int64_t nblocks = 0;
  std::mutex mu;
  std::condition_variable cv;  // alive changes
  int alive = 0;
  std::atomic<bool> abort{false};
  std::exception_ptr error;
  double spin_timeout_s = 30;
  int schedule = 0;  // 0 forward, 1 reverse, 2 shuffled (see Block::run)
  int seed = 0;

  // Run slots, handed over first come first served: a spinning block that gives its slot away
  // must not grab it back before the blocks (or the dispatcher) already waiting for one.
  int permits = 1;
  struct Waiter {
    std::condition_variable cv;
    bool granted = false;
  };
  std::deque<Waiter*> waiters;

  void release_permit_locked() {
    if (waiters.empty()) {
      ++permits;
      return;
    }
    Waiter* w = waiters.front();
    waiters.pop_front();
    w->granted = true;
    w->cv.notify_one();
  }
  void release_permit() {
    std::lock_guard<std::mutex> lock(mu);
    release_permit_locked();
  }
  // false if the launch was aborted (no permit held then)
  bool acquire_permit() {
    std::unique_lock<std::mutex> lock(mu);
    if (abort) return false;
    if (permits > 0 && waiters.empty()) {
      --permits;
      return true;
    }
    Waiter me;
    waiters.push_back(&me);
    me.cv.wait(lock, [&] { return me.granted || abort.load(); });
    if (!me.granted) {
      waiters.erase(std::find(waiters.begin(), waiters.end(), &me));
      return false;
    }
    if (abort) {
      release_permit_locked();
      return false;
    }
    return true;
  }
  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = e;
    abort = true;
    for (Waiter* w : waiters) w->cv.notify_one();
    cv.notify_all();
  }
};

[[noreturn]] inline void raise(const std::string& msg) {
  if (std::getenv("W4K_SIMT_ABORT")) {
    // For debugging: stop right here, on the faulting fiber's stack (gdb shows the kernel frame).
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::abort();
  }
  throw Error(msg);
}

struct Block {
  Launch* launch = nullptr;
  uint3 block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
  int nthreads = 0;
  std::unique_ptr<Fiber[]> fibers;  // not a vector: contexts must not move
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  Barrier bars[16];
  std::vector<WarpState> warps;
  int exited = 0;
  int first_exited = -1;
  Context sched;
  std::exception_ptr error;
  bool holds_permit = true;

  std::string where_tid(int tid) const {
    const Fiber& f = fibers[tid];
    return where(block_idx, f.thread_idx, f.warp, f.lane);
  }
  [[noreturn]] void fail_tid(int tid, const std::string& what) const {
    raise("simt: " + what + " (" + where_tid(tid) + ")");
  }
  // Sorted [begin, end) of the fibers' stack mappings, for "is this local memory?" checks.
  std::vector<std::pair<uintptr_t, uintptr_t>> stack_ranges;
  bool in_fiber_stack(const void* p, size_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = std::upper_bound(stack_ranges.begin(), stack_ranges.end(),
                               std::make_pair(a + n, uintptr_t(0)));
    if (it == stack_ranges.begin()) return false;
    --it;  // the last range starting before a + n
    return a < it->second;
  }
  bool in_dynamic_smem(const void* p) const {
    auto a = reinterpret_cast<uintptr_t>(p), lo = reinterpret_cast<uintptr_t>(smem);
    return a >= lo && a < lo + std::max<size_t>(smem_bytes, 1);
  }

  void run();
  void run_one(Fiber& f);
  void on_exit(Fiber& f);
  [[noreturn]] void deadlock();
  std::string describe_threads(bool only_waiting, int limit) const;
  void release_resources();
};

inline Fiber& current() { return *tl_fiber; }
inline Block& current_block() { return *tl_fiber->block; }

// Errors raised by the running fiber name it.
[[noreturn]] inline void fail_here(const std::string& what) {
  current_block().fail_tid(current().tid, what);
}

// Suspends the running fiber; the scheduler resumes it once its state is Ready again.
inline void suspend(StopReason why) {
  Fiber& f = current();
  f.stop = why;
  switch_context(f.ctx, f.block->sched);
}

// Called by acquire loads and atomics: lets the other threads (and blocks) run, and tells the
// scheduler whether this thread keeps re-reading an unchanged value (a spin that cannot progress
// until someone else writes).
inline void spin_yield(const void* site) {
  Fiber& f = current();
  f.spin_repeat = f.spin_site == site && f.spin_streak >= 1;
  suspend(StopReason::SpinYield);
}
inline void spin_observe(const void* site, uint64_t value) {
  Fiber& f = current();
  f.spin_streak = (f.spin_site == site && f.spin_value == value) ? f.spin_streak + 1 : 0;
  f.spin_site = site;
  f.spin_value = value;
}

// Addresses handed to ldmatrix / cp.async must be shared memory. Dynamic shared memory is
// bounds-checked; static __shared__ (thread_local, see simt.h) cannot be told apart from other
// memory, but a thread's own stack (local memory) can: that is the usual mistake.
inline void check_shared_address(const char* name, const void* p, size_t bytes) {
  Block& b = current_block();
  if (reinterpret_cast<uintptr_t>(p) % bytes)
    fail_here(std::string(name) + ": shared address " + ptr_str(p) + " is not " +
              std::to_string(bytes) + "-byte aligned");
  if (b.in_fiber_stack(p, bytes))
    fail_here(std::string(name) + ": address " + ptr_str(p) +
              " is in a thread's local memory (stack), not in shared memory");
  if (b.in_dynamic_smem(p) &&
      reinterpret_cast<uintptr_t>(p) + bytes > reinterpret_cast<uintptr_t>(b.smem) + b.smem_bytes)
    fail_here(std::string(name) + ": " + std::to_string(bytes) + " bytes at " + ptr_str(p) +
              " run past the end of the block's " + std::to_string(b.smem_bytes) +
              " bytes of dynamic shared memory");
}

// ---- barriers ----

// bar.sync id, count (count = all threads for __syncthreads). Every thread of the block must
// reach the same __syncthreads call site; threads that have exited never arrive, which is an
// error (not the hardware's "exited threads count as arrived"): it is undefined behaviour in CUDA.
// Returns how many arriving threads passed a nonzero `pred` (__syncthreads_count & co).
inline int barrier_arrive(int id, int count, const void* site, bool syncthreads, int pred = 0) {
  Fiber& f = current();
  Block& b = *f.block;
  if (id < 0 || id >= 16)
    fail_here("bar.sync barrier id " + std::to_string(id) + " not in [0, 16)");
  if (count <= 0 || count > b.nthreads || (!syncthreads && count % 32 != 0))
    fail_here("bar.sync " + std::to_string(id) + " with thread count " + std::to_string(count) +
              " (must be a multiple of 32 and at most the block's " + std::to_string(b.nthreads) +
              " threads)");
  Barrier& bar = b.bars[id];
  const char* what = syncthreads ? "__syncthreads" : "bar.sync";
  if (syncthreads && b.exited > 0)
    fail_here(std::string(what) + " reached while " + b.where_tid(b.first_exited) +
              " has already exited: it can never arrive (deadlock)");
  if (bar.arrived == 0) {
    bar.expected = count;
    bar.site = site;
    bar.syncthreads = syncthreads;
  } else {
    if (bar.expected != count || bar.syncthreads != syncthreads)
      fail_here(std::string(what) + " on barrier " + std::to_string(id) + " expects " +
                std::to_string(count) + " threads but " + std::to_string(bar.arrived) +
                " threads wait there expecting " + std::to_string(bar.expected));
    if (syncthreads && bar.site != site)
      fail_here("divergent __syncthreads: this thread is at call site " + site_str(site) +
                " while " + std::to_string(bar.arrived) + " thread(s), first " +
                b.where_tid(bar.waiters.front()) + ", wait at call site " + site_str(bar.site));
  }
  ++bar.arrived;
  bar.pred_count += pred != 0;
  if (bar.arrived == bar.expected) {
    for (int t : bar.waiters) b.fibers[t].state = FiberState::Ready;
    bar.waiters.clear();
    bar.arrived = 0;
    // The released threads read last_count before any of them can arrive here again.
    bar.last_count = bar.pred_count;
    bar.pred_count = 0;
    return bar.last_count;
  }
  bar.waiters.push_back(f.tid);
  f.state = FiberState::Waiting;
  f.wait_name = what;
  f.wait_site = site;
  f.wait_barrier = id;
  suspend(StopReason::Blocked);
  return bar.last_count;
}

// ---- warp rendezvous ----

// The running lane joins collective `fn` over `mask` at `site` with its input/output buffers.
// Returns when the collective is complete (out written). Checks what the hardware assumes:
// the lane is in its mask, every lane named exists and has not exited, and all lanes named
// arrive with the same mask at the same call site (.aligned / same-instruction requirement).
inline void rendezvous(const char* name, CollectiveFn fn, uint32_t mask, const void* site,
                       const void* in, void* out) {
  Fiber& f = current();
  Block& b = *f.block;
  WarpState& w = b.warps[f.warp];
  const uint32_t me = 1u << f.lane;
  if (!(mask & me))
    fail_here(std::string(name) + " with member mask " + hex32(mask) +
              " that does not include the calling lane");
  if (mask & ~w.valid)
    fail_here(std::string(name) + " with member mask " + hex32(mask) +
              " naming lanes that do not exist (warp's lanes: " + hex32(w.valid) + ")");
  if (mask & w.exited)
    fail_here(std::string(name) + " with member mask " + hex32(mask) + " naming exited lanes " +
              hex32(mask & w.exited) + ": they can never arrive (deadlock)");
  Rendezvous* r = nullptr;
  for (Rendezvous& p : w.pending) {
    if (!(p.mask & mask)) continue;
    int waiting_lane = __builtin_ctz(p.arrived);
    std::string waiting = b.where_tid(f.warp * 32 + waiting_lane);
    if (p.mask != mask)
      fail_here("divergent " + std::string(name) + ": this lane uses member mask " + hex32(mask) +
                " while lanes " + hex32(p.arrived) + " (first: " + waiting + ") wait in " + p.name +
                " with member mask " + hex32(p.mask));
    if (p.fn != fn || p.site != site)
      fail_here("divergent " + std::string(name) + " at call site " + site_str(site) + ": lanes " +
                hex32(p.arrived) + " (first: " + waiting + ") wait in " + p.name +
                " at call site " + site_str(p.site) +
                " (all lanes of the mask must execute the "
                "same instruction)");
    r = &p;
    break;
  }
  if (!r) {
    w.pending.emplace_back();
    r = &w.pending.back();
    r->mask = mask;
    r->fn = fn;
    r->name = name;
    r->site = site;
  }
  r->in[f.lane] = in;
  r->out[f.lane] = out;
  r->arrived |= me;
  if (r->arrived == r->mask) {
    Rendezvous done = *r;
    w.pending.erase(w.pending.begin() + (r - w.pending.data()));
    fn(b, f.warp, done);  // may raise (naming the offending lane)
    for (uint32_t m = done.mask & ~me; m; m &= m - 1)
      b.fibers[f.warp * 32 + __builtin_ctz(m)].state = FiberState::Ready;
    return;
  }
  f.state = FiberState::Waiting;
  f.wait_name = name;
  f.wait_site = site;
  f.wait_mask = mask;
  f.wait_barrier = -1;
  suspend(StopReason::Blocked);
}

// ---- per-block scheduler ----

inline void fiber_main(void* arg) {
  Fiber* f = static_cast<Fiber*>(arg);
  fiber_started(f->block->sched);
  try {
    f->block->launch->body();
  } catch (...) {
    if (!f->block->error) f->block->error = std::current_exception();
  }
  f->state = FiberState::Done;
  switch_context(f->ctx, f->block->sched, /*from_exits=*/true);
  std::abort();  // a finished fiber is never resumed
}

// Completes a cp.async. Returns false if the destination was overwritten while the copy was in
// flight (it holds neither the poison written at issue nor the bytes being landed: a store
// raced with the asynchronous copy).
inline bool land(AsyncCopy& c) {
#if W4K_SIMT_ASAN
  if (c.size == 16) __asan_unpoison_memory_region(c.dst, 16);
#endif
  bool intact = true;
  const auto* now = static_cast<const unsigned char*>(c.dst);
  for (int i = 0; i < c.size; ++i) intact &= now[i] == kPoisonByte || now[i] == c.data[i];
  std::memcpy(c.dst, c.data, size_t(c.size));
  return intact;
}

inline void Block::on_exit(Fiber& f) {
  // cp.async copies still in flight complete eventually on the GPU; land them now.
  for (auto& g : f.cp_groups)
    for (auto& c : g) land(c);
  for (auto& c : f.cp_open) land(c);
  f.cp_groups.clear();
  f.cp_open.clear();
  ++exited;
  if (first_exited < 0) first_exited = f.tid;
  WarpState& w = warps[f.warp];
  w.exited |= 1u << f.lane;
  const Barrier& bar = bars[0];
  if (bar.arrived > 0 && bar.syncthreads)
    fail_tid(f.tid, "thread exited while " + std::to_string(bar.arrived) + " thread(s), first " +
                        where_tid(bar.waiters.front()) +
                        ", wait at __syncthreads for it (deadlock)");
  for (const Rendezvous& r : w.pending)
    if (r.mask & (1u << f.lane))
      fail_tid(f.tid, "lane exited in the middle of " + std::string(r.name) + " (member mask " +
                          hex32(r.mask) + "): lanes " + hex32(r.arrived) + " wait for it");
}

inline void Block::run_one(Fiber& f) {
  tl_fiber = &f;
  f.stop = StopReason::None;
  switch_context(sched, f.ctx);
  tl_fiber = nullptr;
  if (error) std::rethrow_exception(error);
  if (f.state == FiberState::Done) on_exit(f);
}

// One line per live thread of the block: running/ready, or what it waits for.
inline std::string Block::describe_threads(bool only_waiting, int limit) const {
  std::ostringstream os;
  int shown = 0;
  for (int t = 0; t < nthreads && shown < limit; ++t) {
    const Fiber& f = fibers[t];
    if (f.state == FiberState::Done || (only_waiting && f.state != FiberState::Waiting)) continue;
    os << "\n  " << where_tid(t);
    if (f.state == FiberState::Ready) {
      os << (&f == tl_fiber ? " is running" : " is ready");
    } else {
      os << " waits in " << f.wait_name;
      if (f.wait_barrier >= 0)
        os << " (barrier " << f.wait_barrier << ", call site " << site_str(f.wait_site) << ")";
      else
        os << " (member mask " << hex32(f.wait_mask) << ", call site " << site_str(f.wait_site)
           << ")";
    }
    ++shown;
  }
  if (first_exited >= 0) os << "\n  " << where_tid(first_exited) << " has exited";
  return os.str();
}

[[noreturn]] inline void Block::deadlock() {
  std::ostringstream os;
  os << "simt: deadlock in block (" << block_idx.x << "," << block_idx.y << "," << block_idx.z
     << "): every live thread is blocked." << describe_threads(true, 6);
  raise(os.str());
}

// For debuggers: `call w4k_simt_dump()` from a breakpoint inside a kernel prints where every
// thread of the current block is.
extern "C" __attribute__((used, noinline)) inline void w4k_simt_dump() {
  if (!tl_block) {
    std::fprintf(stderr, "simt: this OS thread is not running a block\n");
    return;
  }
  const uint3 b = tl_block->block_idx;
  std::fprintf(stderr, "simt: block (%u,%u,%u)%s\n", b.x, b.y, b.z,
               tl_block->describe_threads(false, 1 << 30).c_str());
}

// A thread that re-read the same value this many times in a row at one site is spinning.
constexpr int kLongSpin = 64;

inline void Block::run() {
  const int max_backoff_us = 2000;
  auto stall_start = std::chrono::steady_clock::now();
  bool stalling = false;
  int backoff_us = 20;
  // Thread order of each scheduling round (W4K_SIMT_SCHEDULE): forward, reverse, or a fresh
  // random permutation per round. Race-free kernels give the same result under all three; a
  // missing __syncthreads usually shows up as poison under at least one of them.
  std::vector<int> order(size_t(nthreads), 0);
  for (int t = 0; t < nthreads; ++t)
    order[size_t(t)] = launch->schedule == 1 ? nthreads - 1 - t : t;
  std::minstd_rand rng(uint32_t(launch->seed) * 7919u + block_idx.x * 31u + block_idx.y * 17u +
                       block_idx.z);
  for (;;) {
    bool any_ran = false, only_repeated_spins = true, long_spin = false;
    int live = 0;
    if (launch->schedule == 2) std::shuffle(order.begin(), order.end(), rng);
    for (int t : order) {
      Fiber& f = fibers[t];
      if (f.state == FiberState::Ready) {
        any_ran = true;
        run_one(f);
        const bool spun = f.state == FiberState::Ready && f.stop == StopReason::SpinYield;
        if (!(spun && f.spin_repeat)) only_repeated_spins = false;
        if (spun && f.spin_streak >= kLongSpin) long_spin = true;
        if (launch->abort) return;
      }
      if (f.state != FiberState::Done) ++live;
    }
    if (live == 0) return;
    if (!any_ran) deadlock();
    if (!only_repeated_spins && !long_spin) {
      stalling = false;
      backoff_us = 20;
      continue;
    }
    // Every runnable thread re-read an unchanged value (or one thread has been re-reading the
    // same value for a long time, e.g. a spin loop with a warp vote in it): maybe only another
    // block can unblock us.
    auto now = std::chrono::steady_clock::now();
    if (!stalling) {
      stalling = true;
      stall_start = now;
    } else if (std::chrono::duration<double>(now - stall_start).count() > launch->spin_timeout_s) {
      for (int t = 0; t < nthreads; ++t)
        if (fibers[t].state == FiberState::Ready)
          fail_tid(t,
                   "spin timeout: the threads of this block have re-read unchanged values "
                   "(ld.acquire / atomics) for " +
                       std::to_string(int(launch->spin_timeout_s)) +
                       " s; no other block released them (inter-block deadlock?)");
    }
    launch->release_permit();
    if (only_repeated_spins) {
      std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
      backoff_us = std::min(backoff_us * 2, max_backoff_us);
    } else {
      std::this_thread::yield();  // the block may still be progressing: just let others in
    }
    if (!launch->acquire_permit()) {
      holds_permit = false;
      return;
    }
  }
}

}  // namespace simt
