// The thread pool of the CPU Marlin / AWQ GEMMs: w4a16_gemm, w4a8_gemm and awq_gemm run their
// work items through WorkQueue::run.
//
// Two ways to run a job, chosen per call (W4K_QUEUE = auto (default) | omp | own):
//
// * On torch's OpenMP team (at::parallel_for, every thread claiming items from one counter).
//   In a model, the ops between our GEMMs (norms, attention, activations) run on that team, and
//   after each of them its idle worker spins for a while (libgomp's default wait policy): an
//   item queue with threads of its own then competes for the second core with a thread that
//   spins on it. Measured in a whole model (benchmarks/bench_model.py, 4-layer Llama, 2 threads,
//   bf16): see the README ("Threads").
//
// * On our own workers. An OpenMP region ends in a barrier that every thread of the team must
//   reach, including a thread the OS has not scheduled yet. On a machine whose cores are kept
//   busy by other processes the calling thread finishes the work alone, then waits at the
//   barrier for a thread that needs the very core it is spinning on: a 0.8 ms M = 1 call took
//   16.8 ms (issue 9, item 7). Here the caller waits only for items that were actually claimed:
//   every thread, the caller included, claims items from one counter, and a worker that wakes
//   up after the last item was claimed finds nothing and goes back to sleep. So the caller
//   never waits for a thread that has not started, and with every worker descheduled the call
//   degrades to the single-threaded time.
//
// auto: the own workers under OMP_WAIT_POLICY=passive (no spinning team thread to use, and a
// wake-up per OpenMP region); otherwise OpenMP while it is punctual. The caller measures how
// long it waited at the region's end barrier after its own last item; a wait longer than
// kLateWaitNs and twice the longest item it ran itself can only be a team thread that started
// late or was preempted mid-item, so the next kOwnQueueCalls jobs run on our own workers, then
// OpenMP is tried again; each late retry doubles the stretch (up to kMaxOwnQueueCalls), a
// punctual job resets it. On a quiet machine every job runs on OpenMP; under lasting load late
// jobs become rare (one per kMaxOwnQueueCalls jobs), and a passing burst of load costs a few
// short stretches.
//
// Our own idle workers poll for the next job for W4K_QUEUE_SPIN_US (default 200 us, yielding
// the core every few hundred pauses), then sleep on a condition variable. The poll pays on a
// quiet machine (a sleeping worker's vCPU idles, and waking it costs more: 4096 x 4096 at M = 1
// 0.36-0.38 ms polling, 0.59 sleeping) and costs under load, where it competes for a core with
// the very threads that load it (11008 x 4096 at M = 4 under two busy processes: 5.3 ms
// polling, 4.4 sleeping). So a polling worker that was slow to start a job (kSlowStartNs after
// it was published: it was not scheduled) stops polling for the next kNoPollJobs jobs; measured
// interleaved with both, this was as fast as the faster of them in each case above, quiet or
// loaded (README "Threads"; measured before the rule ignored starts from sleep, whose lateness
// is the wake-up's, not the load's). The counter carries the job's generation in its high 32
// bits, so a late worker can never claim an item of a later job with the previous job's
// function.
//
// A worker woken from its sleep is steered off the caller's CPU. On a lightly loaded machine the
// scheduler may queue a woken thread on the waker's CPU (wake-affine placement; the 2-vCPU VM of
// 2026-12-02 packs tasks onto busy vCPUs) and move it only at a later balance: measured there, a
// worker woken after a 10 ms idle stretch first ran 0.9 ms after the job was published, on the
// other CPU, so a 0.65 ms M = 1 call took 1.5-1.7 ms (one thread alone: 1.22). So before the
// wake-up the caller narrows each sleeping worker's CPU mask to its usual mask minus the CPU the
// caller runs on (when that leaves a CPU), and the worker restores its mask when its part of the
// job is done (the same call: 1.00-1.06 ms). A polling worker is running on a CPU of its own
// already and is left alone. W4K_QUEUE_STEER=0 turns this off. Linux only.
//
// An item that throws (a check on the values it reads) fails the job: the items not yet started
// are skipped, and run() rethrows the first exception on the caller once every claimed item has
// finished (as at::parallel_for does).
//
// Results do not depend on which thread runs an item (each item writes its own outputs, in a
// fixed order), so thread counts and the two ways give the same bits.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <strings.h>  // strcasecmp

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace w4k::cpu {

class WorkQueue {
 public:
  // Jobs run so far (inline jobs of one thread or one item are not counted).
  struct Stats {
    int64_t openmp_jobs = 0;       // on torch's OpenMP team
    int64_t own_jobs = 0;          // on our own workers
    int64_t late_openmp_jobs = 0;  // OpenMP jobs whose caller waited for a late team thread
    int64_t steered_wakes = 0;     // sleeping workers woken with the caller's CPU masked off
  };
  Stats stats() {
    std::lock_guard<std::mutex> job(job_mutex_);
    return stats_;
  }

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
    const Mode how = mode();
    if (how == Mode::kOpenMp || (how == Mode::kAuto && auto_on_openmp())) {
      ++stats_.openmp_jobs;
      const bool late = run_openmp(num_items, threads, fn);
      if (how == Mode::kAuto) after_auto_openmp_job(late);
      return;
    }
    ++stats_.own_jobs;
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(workers_.size()) < threads - 1) {
        workers_.push_back(std::make_unique<Worker>());
        Worker* w = workers_.back().get();
        w->thread = std::thread([this, w, index = static_cast<int>(workers_.size()) - 1] {
          worker(*w, index);
        });
      }
      stats_.steered_wakes += steer_sleeping_workers(threads - 1);
      gen = ++generation_;
      published_at_ns_.store(now_ns(), std::memory_order_relaxed);
      published_.store(gen, std::memory_order_release);
      fn_ = &fn;
      num_items_ = num_items;
      active_workers_ = threads - 1;
      error_ = nullptr;
      failed_.store(false, std::memory_order_relaxed);
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
    if (failed_.load(std::memory_order_acquire)) {
      std::exception_ptr error;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        error = error_;
        error_ = nullptr;
      }
      std::rethrow_exception(error);
    }
  }

 private:
  WorkQueue() = default;

  struct Worker {
    std::thread thread;
    std::atomic<bool> asleep{false};   // waiting on wake_ (set just before, cleared after)
    std::atomic<bool> steered{false};  // its CPU mask was narrowed for the current job
#if defined(__linux__)
    cpu_set_t usual;                   // its CPU mask as created (set before it first sleeps)
#endif
  };

  // Narrows the mask of each of the first `count` workers that sleeps to its usual mask minus
  // the caller's CPU (see the header comment); returns how many. Called with mutex_ held.
  int steer_sleeping_workers(int count) {
    int steered = 0;
#if defined(__linux__)
    if (!steer_) return 0;
    const int caller_cpu = sched_getcpu();
    if (caller_cpu < 0 || caller_cpu >= CPU_SETSIZE) return 0;
    for (int i = 0; i < count; ++i) {
      Worker& w = *workers_[i];
      if (!w.asleep.load(std::memory_order_acquire) || w.steered.load(std::memory_order_relaxed))
        continue;
      cpu_set_t mask = w.usual;
      if (!CPU_ISSET(caller_cpu, &mask)) continue;
      CPU_CLR(caller_cpu, &mask);
      if (CPU_COUNT(&mask) == 0) continue;
      if (pthread_setaffinity_np(w.thread.native_handle(), sizeof(mask), &mask) != 0) continue;
      w.steered.store(true, std::memory_order_release);
      ++steered;
    }
#else
    (void)count;
#endif
    return steered;
  }

  // A wait at OpenMP's end barrier longer than this (and than twice the caller's longest item)
  // means a team thread was late; then this many jobs run on our own workers.
  static constexpr int64_t kLateWaitNs = 200 * 1000;
  static constexpr int kOwnQueueCalls = 32;
  static constexpr int kMaxOwnQueueCalls = 16384;  // doubled per late retry up to this

  enum class Mode { kAuto, kOpenMp, kOwn };  // only auto's jobs move auto's state
  static Mode mode() {
    const char* env = std::getenv("W4K_QUEUE");  // read per call: tests switch it
    if (env == nullptr || std::strcmp(env, "auto") == 0) return Mode::kAuto;
    return std::strcmp(env, "omp") == 0 ? Mode::kOpenMp : Mode::kOwn;
  }

  // auto: whether this job runs on OpenMP (else a job of a stretch on our own workers).
  // Called with job_mutex_ held, as after_auto_openmp_job.
  bool auto_on_openmp() {
    // OMP_WAIT_POLICY=passive: the team's threads sleep after every region, so a job on
    // OpenMP pays a wake-up and there is no spinning thread to compete with (M = 1, 4096 x
    // 4096: 0.41 ms on OpenMP, 0.35 on the own workers).
    static const bool passive = [] {
      const char* env = std::getenv("OMP_WAIT_POLICY");
      return env != nullptr && strcasecmp(env, "passive") == 0;
    }();
    if (passive) return false;
    if (own_calls_left_ == 0) return true;
    --own_calls_left_;
    return false;
  }
  void after_auto_openmp_job(bool late) {
    if (late) {
      own_calls_left_ = own_calls_after_late_;
      own_calls_after_late_ = std::min(2 * own_calls_after_late_, kMaxOwnQueueCalls);
    } else {
      own_calls_after_late_ = kOwnQueueCalls;
    }
  }

  // The job on torch's OpenMP team: at::parallel_for over one index per thread, each claiming
  // items from a counter; the caller is the team's master. Returns whether the caller waited
  // for a late team thread at the region's end. Called with job_mutex_ held.
  bool run_openmp(int64_t num_items, int threads, const std::function<void(int64_t)>& fn) {
    using clock = std::chrono::steady_clock;
    std::atomic<int64_t> next{0};
    clock::time_point caller_done;
    int64_t longest_item_ns = 0;
    const int64_t test_late_us = [] {  // test hook: team threads other than the caller start late
      const char* env = std::getenv("W4K_QUEUE_TEST_LATE_US");
      return env ? std::atoll(env) : 0;
    }();
    const std::thread::id caller_id = std::this_thread::get_id();
    // (Inside an enclosing parallel region at::parallel_for runs inline on the caller.)
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
      const bool caller = std::this_thread::get_id() == caller_id;
      if (!caller && test_late_us > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(test_late_us));
      for (int64_t i = next.fetch_add(1); i < num_items; i = next.fetch_add(1)) {
        const clock::time_point t0 = caller ? clock::now() : clock::time_point{};
        fn(i);
        if (caller)
          longest_item_ns = std::max<int64_t>(
              longest_item_ns,
              std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count());
      }
      if (caller) caller_done = clock::now();
    });
    const int64_t wait_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - caller_done).count();
    // (The process's first region also starts the team's threads: not a late thread.)
    const bool late =
        stats_.openmp_jobs > 1 && wait_ns > std::max(kLateWaitNs, 2 * longest_item_ns);
    stats_.late_openmp_jobs += late;
    return late;
  }

  void claim_items(uint64_t gen, int64_t num_items, const std::function<void(int64_t)>& fn) {
    for (;;) {
      uint64_t cur = next_.load(std::memory_order_acquire);
      if ((cur >> 32) != (gen & 0xffffffffu) || static_cast<int64_t>(cur & 0xffffffffu) >= num_items)
        return;
      if (!next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
      if (!failed_.load(std::memory_order_acquire)) {
        try {
          fn(static_cast<int64_t>(cur & 0xffffffffu));
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex_);
          if (!failed_.load(std::memory_order_relaxed)) error_ = std::current_exception();
          failed_.store(true, std::memory_order_release);
        }
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void worker(Worker& self, int index) {
#if defined(__linux__)
    if (pthread_getaffinity_np(pthread_self(), sizeof(self.usual), &self.usual) != 0)
      CPU_ZERO(&self.usual);  // (an empty usual mask: never steered)
#endif
    uint64_t seen = 0;
    int quiet_jobs_left = 0;  // jobs to go before this worker polls again
    const int64_t spin_ns = spin_ns_;
    for (;;) {
      uint64_t gen;
      int64_t num_items;
      const std::function<void(int64_t)>* fn;
      // Poll a while before sleeping: back-to-back calls (the layers of a decode step) then
      // find this worker awake.
      const int64_t poll_ns = quiet_jobs_left > 0 ? 0 : spin_ns;
      const auto spin_end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(poll_ns);
      bool found_polling = false;  // the job came while this worker polled (not asleep)
      for (int i = 0; poll_ns > 0; ++i) {
        if (published_.load(std::memory_order_acquire) != seen) {
          found_polling = true;
          break;
        }
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
        self.asleep.store(true, std::memory_order_release);
        wake_.wait(lock, [&] { return generation_ != seen && index < active_workers_; });
        self.asleep.store(false, std::memory_order_relaxed);
        seen = gen = generation_;
        num_items = num_items_;
        fn = fn_;
      }
      // (A worker woken from sleep is late by the wake-up, which says nothing about load.)
      if (found_polling &&
          now_ns() - published_at_ns_.load(std::memory_order_relaxed) > kSlowStartNs)
        quiet_jobs_left = kNoPollJobs;
      else if (quiet_jobs_left > 0)
        --quiet_jobs_left;
      claim_items(gen, num_items, *fn);
#if defined(__linux__)
      if (self.steered.load(std::memory_order_acquire)) {
        pthread_setaffinity_np(pthread_self(), sizeof(self.usual), &self.usual);
        self.steered.store(false, std::memory_order_release);
      }
#endif
    }
  }

  int own_calls_left_ = 0;             // auto: jobs left to run on our own workers
  int own_calls_after_late_ = kOwnQueueCalls;  // auto: the next late job's own-worker stretch
  Stats stats_;                        // guarded by job_mutex_
  std::mutex job_mutex_;               // one job at a time
  std::mutex mutex_;                   // guards the job description below and workers_
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint64_t generation_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_items_ = 0;
  int active_workers_ = 0;
  std::atomic<uint64_t> next_{0};      // (generation << 32) | next unclaimed item
  std::atomic<int64_t> done_{0};       // items finished in the current job
  std::atomic<bool> failed_{false};    // an item of the current job threw
  std::exception_ptr error_;           // the first exception it threw (guarded by mutex_)
  std::atomic<uint64_t> published_{0};  // generation_, readable without the mutex
  std::atomic<int64_t> published_at_ns_{0};  // when the current job was published
  // A polling worker that starts a job more than kSlowStartNs after it was published (it was
  // not scheduled: a loaded machine) does not poll after the next kNoPollJobs jobs.
  static constexpr int64_t kSlowStartNs = 500 * 1000;
  static constexpr int kNoPollJobs = 256;
  const bool steer_ = [] {  // W4K_QUEUE_STEER=0: no steering of woken workers
    const char* env = std::getenv("W4K_QUEUE_STEER");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  // How long an idle worker polls for the next job before it sleeps (W4K_QUEUE_SPIN_US).
  const int64_t spin_ns_ = [] {
    const char* env = std::getenv("W4K_QUEUE_SPIN_US");
    return (env ? std::atoll(env) : 200) * 1000;
  }();
};

}  // namespace w4k::cpu
