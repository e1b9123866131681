// The thread pool of the CPU w4a16_gemm kernel (torch-free).
//
// Why not at::parallel_for (OpenMP here): an OpenMP region ends in a barrier that every thread
// of the team must reach, including a thread the OS has not scheduled yet. On a machine whose
// cores are kept busy by other processes the calling thread finishes the work alone, then spins
// at the barrier (libgomp spins before it sleeps) waiting for a thread that needs the very core
// it is spinning on: a 0.8 ms M = 1 call took 16.8 ms (issue 9, item 7).
//
// Here the caller waits only for items that were actually claimed: every thread, the caller
// included, claims items from one counter, and a worker that wakes up after the last item was
// claimed finds nothing and goes back to sleep. So the caller never waits for a thread that has
// not started, and with every worker descheduled the call degrades to the single-threaded time.
// An idle worker polls for the next job for W4K_QUEUE_SPIN_US (default 200 us, yielding the core
// every few hundred pauses), then sleeps on a condition variable: back-to-back calls find it
// awake (a futex wake-up cost ~4 us per call at M = 1 on this 2-vCPU VM), and between bursts it
// burns nothing. The poll never delays the caller: it only decides how soon a worker joins.
// The counter carries the job's generation in its high 32 bits, so a late worker can never
// claim an item of a later job with the previous job's function.
//
// Results do not depend on which thread runs an item (each item writes its own outputs, in a
// fixed order), so thread counts give the same bits.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace w4k::cpu {

class WorkQueue {
 public:
  static WorkQueue& instance() {
    static WorkQueue* queue = new WorkQueue;  // never destroyed: workers outlive static dtors
    return *queue;
  }

  // Runs fn(item) for every item in [0, num_items) on up to `threads` threads, the caller being
  // one of them, and returns when all have finished. num_items < 2^32. A second caller while a
  // job runs (another Python thread, or a call from inside fn) runs its items inline.
  void run(int64_t num_items, int threads, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> job(job_mutex_, std::try_to_lock);
    if (threads <= 1 || num_items <= 1 || !job.owns_lock()) {
      for (int64_t i = 0; i < num_items; ++i) fn(i);
      return;
    }
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(workers_.size()) < threads - 1)
        workers_.emplace_back([this, index = static_cast<int>(workers_.size())] { worker(index); });
      gen = ++generation_;
      published_.store(gen, std::memory_order_release);
      fn_ = &fn;
      num_items_ = num_items;
      active_workers_ = threads - 1;
      done_.store(0, std::memory_order_relaxed);
      next_.store(gen << 32, std::memory_order_release);
    }
    wake_.notify_all();
    claim_items(gen, num_items, fn);
    // Wait for the items other threads claimed (none if they never started).
    for (int spins = 0; done_.load(std::memory_order_acquire) < num_items; ++spins) {
      if (spins < 2000) {
#if defined(__x86_64__)
        _mm_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  WorkQueue() = default;

  void claim_items(uint64_t gen, int64_t num_items, const std::function<void(int64_t)>& fn) {
    for (;;) {
      uint64_t cur = next_.load(std::memory_order_acquire);
      if ((cur >> 32) != (gen & 0xffffffffu) || static_cast<int64_t>(cur & 0xffffffffu) >= num_items)
        return;
      if (!next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
      fn(static_cast<int64_t>(cur & 0xffffffffu));
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void worker(int index) {
    uint64_t seen = 0;
    const int64_t spin_ns = spin_ns_;
    for (;;) {
      uint64_t gen;
      int64_t num_items;
      const std::function<void(int64_t)>* fn;
      // Poll a while before sleeping: back-to-back calls (the layers of a decode step) then
      // find this worker awake. A sleeping worker costs a wake-up per call, which on this VM
      // took longer than an M = 1 call's whole work (the second thread did nothing).
      const auto spin_end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns);
      for (int i = 0; published_.load(std::memory_order_acquire) == seen; ++i) {
#if defined(__x86_64__)
        _mm_pause();
#endif
        if ((i & 255) == 255) {
          if (std::chrono::steady_clock::now() > spin_end) break;
          std::this_thread::yield();  // a loaded machine: let whoever waits for a core run
        }
      }
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen && index < active_workers_; });
        seen = gen = generation_;
        num_items = num_items_;
        fn = fn_;
      }
      claim_items(gen, num_items, *fn);
    }
  }

  std::mutex job_mutex_;               // one job at a time
  std::mutex mutex_;                   // guards the job description below and workers_
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_items_ = 0;
  int active_workers_ = 0;
  std::atomic<uint64_t> next_{0};      // (generation << 32) | next unclaimed item
  std::atomic<int64_t> done_{0};       // items finished in the current job
  std::atomic<uint64_t> published_{0};  // generation_, readable without the mutex
  // How long an idle worker polls for the next job before it sleeps (W4K_QUEUE_SPIN_US).
  const int64_t spin_ns_ = [] {
    const char* env = std::getenv("W4K_QUEUE_SPIN_US");
    return (env ? std::atoll(env) : 200) * 1000;
  }();
};

}  // namespace w4k::cpu
