// Fibers for the SIMT emulator: one user-level context per CUDA thread.
//
// Default: hand-written x86-64 switch (fiber_switch_x86_64.S, saves 6 registers + MXCSR/x87
// control word; a yield round trip fiber -> block scheduler -> fiber measures ~65 ns).
// -DW4K_SIMT_UCONTEXT selects makecontext/swapcontext instead (portable, ~1 us per round trip:
// glibc saves and restores the signal mask with a syscall on every swap). Under AddressSanitizer
// both paths tell ASan about every stack switch (__sanitizer_start/finish_switch_fiber), so ASan
// keeps reporting real stack errors instead of false ones. Fiber stacks are mmap'ed with a
// PROT_NONE guard page below them: a stack overflow is a SIGSEGV at the guard, not corruption.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(W4K_SIMT_UCONTEXT)
#include <ucontext.h>
#elif !defined(__x86_64__)
#error "the SIMT emulator's fast fiber switch is x86-64 only; build with -DW4K_SIMT_UCONTEXT"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define W4K_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define W4K_SIMT_ASAN 1
#endif
#endif

#ifndef W4K_SIMT_ASAN
#define W4K_SIMT_ASAN 0
#endif

#if W4K_SIMT_ASAN
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                     size_t* size_old);
void __asan_unpoison_memory_region(void const volatile* addr, size_t size);
void __asan_poison_memory_region(void const volatile* addr, size_t size);
}
#endif

#if !defined(W4K_SIMT_UCONTEXT)
extern "C" void w4k_simt_fiber_switch(void** save_sp, void* load_sp);
extern "C" void w4k_simt_fiber_trampoline();
#endif

namespace simt {

// Stack size of one fiber (one CUDA thread). Kernels keep their register fragments here; ASan
// builds use much bigger frames. Override with W4K_SIMT_STACK_KB.
inline size_t fiber_stack_bytes() {
  static const size_t bytes = [] {
    size_t kb = W4K_SIMT_ASAN ? 1024 : 256;
    if (const char* env = std::getenv("W4K_SIMT_STACK_KB")) kb = std::strtoull(env, nullptr, 10);
    if (kb < 64) kb = 64;
    return kb * 1024;
  }();
  return bytes;
}

// One mmap'ed stack: [base, base + guard) is PROT_NONE, [base + guard, base + total) usable.
struct Stack {
  char* base = nullptr;
  size_t total = 0;
  static constexpr size_t kGuard = 4096;
  char* bottom() const { return base + kGuard; }
  size_t size() const { return total - kGuard; }
  char* top() const { return base + total; }
};

// Stacks are recycled across blocks and launches: mmap/munmap per CUDA thread would dominate the
// run time of small kernels.
class StackPool {
 public:
  static StackPool& get() {
    static StackPool* pool = new StackPool();  // never destroyed: fibers may outlive statics
    return *pool;
  }
  Stack take() {
    const size_t want = fiber_stack_bytes() + Stack::kGuard;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!free_.empty()) {
        Stack s = free_.back();
        free_.pop_back();
        if (s.total == want) return s;
        munmap(s.base, s.total);
      }
    }
    void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("simt: mmap of a fiber stack failed");
    mprotect(p, Stack::kGuard, PROT_NONE);
    return Stack{static_cast<char*>(p), want};
  }
  void give(Stack s) {
    if (!s.base) return;
#if W4K_SIMT_ASAN
    // A fiber abandoned mid-kernel (block aborted by an error) leaves its frames' redzones
    // poisoned in ASan's shadow; the next fiber on this stack must start clean.
    __asan_unpoison_memory_region(s.bottom(), s.size());
#endif
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_.size() < kMaxPooled) {
        free_.push_back(s);
        return;
      }
    }
    munmap(s.base, s.total);  // a burst of concurrent blocks: do not keep its pages forever
  }

 private:
  static constexpr size_t kMaxPooled = 4096;  // 16 blocks of 256 threads
  std::mutex mu_;
  std::vector<Stack> free_;
};

// A suspended execution context. The OS thread's own context (the block scheduler) is a
// Context without a stack of ours.
struct Context {
#if defined(W4K_SIMT_UCONTEXT)
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif
  // ASan bookkeeping: the stack this context runs on, and the fake-stack handle saved while it
  // is switched out.
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
  void* fake_stack = nullptr;
};

using FiberEntry = void (*)(void* arg);

#if defined(W4K_SIMT_UCONTEXT)
namespace detail {
// makecontext passes int arguments only: split the two pointers into 32-bit halves.
inline void ucontext_entry(unsigned f_lo, unsigned f_hi, unsigned a_lo, unsigned a_hi) {
  auto f = reinterpret_cast<FiberEntry>((uintptr_t(f_hi) << 32) | f_lo);
  void* a = reinterpret_cast<void*>((uintptr_t(a_hi) << 32) | a_lo);
  f(a);
  std::abort();  // entry never returns
}
}  // namespace detail
#endif

// Prepares ctx so that the first switch into it calls entry(arg) on the given stack.
inline void make_context(Context& ctx, const Stack& stack, FiberEntry entry, void* arg) {
  ctx.stack_bottom = stack.bottom();
  ctx.stack_size = stack.size();
  ctx.fake_stack = nullptr;
#if defined(W4K_SIMT_UCONTEXT)
  getcontext(&ctx.uc);
  ctx.uc.uc_stack.ss_sp = stack.bottom();
  ctx.uc.uc_stack.ss_size = stack.size();
  ctx.uc.uc_link = nullptr;
  uintptr_t f = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&ctx.uc, reinterpret_cast<void (*)()>(&detail::ucontext_entry), 4, unsigned(f),
              unsigned(f >> 32), unsigned(a), unsigned(a >> 32));
#else
  // Frame layout documented in fiber_switch_x86_64.S. top is 16-byte aligned, so frame is too.
  uintptr_t top = reinterpret_cast<uintptr_t>(stack.top()) & ~uintptr_t(15);
  uint64_t* frame = reinterpret_cast<uint64_t*>(top - 128);
  uint32_t mxcsr = 0x1F80;  // all exceptions masked, round to nearest, no FTZ/DAZ
  uint16_t fpucw = 0x037F;  // x87 default: extended precision, all exceptions masked
  frame[0] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
  frame[1] = 0;                                  // r15
  frame[2] = 0;                                  // r14
  frame[3] = reinterpret_cast<uint64_t>(entry);  // r13
  frame[4] = reinterpret_cast<uint64_t>(arg);    // r12
  frame[5] = 0;                                  // rbx
  frame[6] = 0;                                  // rbp
  frame[7] = reinterpret_cast<uint64_t>(&w4k_simt_fiber_trampoline);
  ctx.sp = frame;
#endif
}

// Switches from `from` (the running context) to `to`. Returns when something switches back
// into `from`. `from_exits` says `from` will never be resumed (lets ASan free its fake stack).
inline void switch_context(Context& from, Context& to, bool from_exits = false) {
#if W4K_SIMT_ASAN
  __sanitizer_start_switch_fiber(from_exits ? nullptr : &from.fake_stack, to.stack_bottom,
                                 to.stack_size);
#else
  (void)from_exits;
#endif
#if defined(W4K_SIMT_UCONTEXT)
  swapcontext(&from.uc, &to.uc);
#else
  w4k_simt_fiber_switch(&from.sp, to.sp);
#endif
#if W4K_SIMT_ASAN
  // Back in `from`. ASan tells us which stack we came from; the scheduler context learns its
  // own (OS thread) stack bounds this way the first time a fiber switches back to it.
  const void* prev_bottom = nullptr;
  size_t prev_size = 0;
  __sanitizer_finish_switch_fiber(from.fake_stack, &prev_bottom, &prev_size);
  (void)prev_bottom;
  (void)prev_size;
#endif
}

// First thing a fiber entry function must call (completes the ASan switch into a new stack and
// records the scheduler's stack bounds so that switching back can be announced correctly).
inline void fiber_started(Context& scheduler) {
#if W4K_SIMT_ASAN
  const void* bottom = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
  scheduler.stack_bottom = bottom;
  scheduler.stack_size = size;
#else
  (void)scheduler;
#endif
}

}  // namespace simt
