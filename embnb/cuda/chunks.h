// Chunks of work shared by the calling thread and helper threads, where the
// caller never waits for a thread that has not started a chunk.
//
// The knapsack makes one short parallel step per table, thousands per run.
// A parallel region per step (at::parallel_for, OpenMP) joins every thread
// at its end, so on a loaded machine each step waits for whichever thread
// the OS has descheduled: on 2 cores under a load of 3, 5,000 tables x 128
// devices took 208 s instead of 19 s (commit e7be252). Here each chunk is
// claimed by whoever comes first; the caller claims chunks too and then
// waits only for chunks a helper has claimed and not finished. A helper
// that is late claims nothing, and the caller does its share.
//
// Helpers live as long as the object (one knapsack run): none is alive
// across calls, so nothing is left in a forked child.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace embnb {

// A spin-wait hint to the core (it yields to the sibling hyperthread and
// eases the cache line the other threads write).
inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Chunks {
 public:
  // `helpers` threads besides the caller (0: the caller does every chunk).
  explicit Chunks(int helpers) {
    for (int h = 1; h <= helpers; ++h) threads_.emplace_back([this, h] { help(h); });
  }

  ~Chunks() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

  Chunks(const Chunks&) = delete;
  Chunks& operator=(const Chunks&) = delete;

  // The threads that may run a chunk: `worker` in task(chunk, worker) is below it.
  int workers() const { return static_cast<int>(threads_.size()) + 1; }

  // task(chunk, worker) for every chunk in [0, num_chunks); returns when all
  // are done. Worker 0 is the caller.
  void run(int64_t num_chunks, const std::function<void(int64_t, int)>& task) {
    if (threads_.empty() || num_chunks <= 1) {
      for (int64_t chunk = 0; chunk < num_chunks; ++chunk) task(chunk, 0);
      return;
    }
    task_ = &task;
    num_chunks_.store(num_chunks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t round = (ticket_.load(std::memory_order_relaxed) >> 32) + 1;
    ticket_.store(round << 32, std::memory_order_release);  // publishes the task above
    if (sleeping_.load(std::memory_order_acquire) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    claim(round, 0);
    while (done_.load(std::memory_order_acquire) < num_chunks) std::this_thread::yield();
  }

 private:
  // Claims and runs this round's chunks until none is left.
  void claim(uint64_t round, int worker) {
    const int64_t num_chunks = num_chunks_.load(std::memory_order_relaxed);
    uint64_t ticket = ticket_.load(std::memory_order_acquire);
    while ((ticket >> 32) == round && static_cast<int64_t>(ticket & 0xffffffff) < num_chunks) {
      if (ticket_.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel)) {
        (*task_)(static_cast<int64_t>(ticket & 0xffffffff), worker);
        done_.fetch_add(1, std::memory_order_release);
        ticket = ticket_.load(std::memory_order_acquire);
      }
    }
  }

  void help(int worker) {
    uint64_t seen = 0;
    while (true) {
      // A new round comes within microseconds while a run lasts: spin a
      // little before sleeping.
      uint64_t round = ticket_.load(std::memory_order_acquire) >> 32;
      for (int spin = 0; round == seen && spin < 20000; ++spin) {
        relax();
        round = ticket_.load(std::memory_order_acquire) >> 32;
      }
      if (round == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1, std::memory_order_acq_rel);
        wake_.wait(lock, [&] { return stopping_ || (ticket_.load(std::memory_order_acquire) >> 32) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_acq_rel);
        if (stopping_) return;
        round = ticket_.load(std::memory_order_acquire) >> 32;
      }
      seen = round;
      claim(round, worker);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<int> sleeping_{0};
  // The round (high 32 bits) and its next unclaimed chunk (low 32 bits).
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int64_t> done_{0};
  const std::function<void(int64_t, int)>* task_ = nullptr;
  std::atomic<int64_t> num_chunks_{0};
};

}  // namespace embnb
