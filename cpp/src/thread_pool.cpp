// The worker pool behind parallel_for (thread_pool.hpp).
//
// A loop is a Job: the body, its index count and two counters, `next` (the next index to
// claim) and `done`. The caller publishes the job, claims indices like any worker, then waits
// until `done` reaches n: only for indices some worker has claimed. Workers keep a shared
// reference to the job they joined, so one that wakes late claims from a finished job (and
// finds nothing) instead of touching freed memory. Idle workers spin on the job generation for
// kSpin before sleeping on a condition variable, as GNU OpenMP does (for a few milliseconds):
// the kernels of a training step run back to back with Python between them, and a worker that
// has to be woken joins a loop late. With a 0.2 ms spin the step ran 2-18% slower than with
// OpenMP; with 3 ms, within 2% either way (alternated in one process).
#include "shardlab/thread_pool.hpp"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

namespace shardlab {

int max_threads() { return omp_get_max_threads(); }

namespace pool_detail {
namespace {

constexpr auto kSpin = std::chrono::milliseconds(3);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

struct Job {
  IndexFn fn;
  void* body;
  std::int64_t n;
  int workers;  // workers that may join: the loop's thread count - 1
  std::atomic<std::int64_t> next{0}, done{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  Job(IndexFn f, void* b, std::int64_t count, int w) : fn(f), body(b), n(count), workers(w) {}

  void run_indices() {
    for (std::int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      try {
        fn(body, i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

thread_local bool t_in_loop = false;  // running indices of a loop: nested loops run serially

// The loop on the calling thread alone, with the pool's contract: every index runs, then the
// first exception is rethrown.
void run_serial(std::int64_t n, IndexFn fn, void* body) {
  std::exception_ptr error;
  for (std::int64_t i = 0; i < n; ++i) {
    try {
      fn(body, i);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

class Pool {
 public:
  Pool() { pthread_atfork(nullptr, nullptr, [] { instance()->reset_in_child(); }); }

  // Never destroyed: its detached workers may still be waiting when the process exits.
  static Pool* instance() {
    static Pool* const pool = new Pool;
    return pool;
  }

  void run(std::int64_t n, int threads, IndexFn fn, void* body) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (t_in_loop || !busy.owns_lock()) return run_serial(n, fn, body);
    const int workers = static_cast<int>(std::min<std::int64_t>(threads, n)) - 1;
    start_workers(workers);
    auto job = std::make_shared<Job>(fn, body, n, workers);
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
      wake = sleeping_ > 0;
    }
    if (wake) cv_.notify_all();
    t_in_loop = true;
    job->run_indices();
    t_in_loop = false;
    // Only indices a worker claimed are left: wait for them, yielding the core after a while
    // in case that worker shares it.
    for (int spins = 0; job->done.load(std::memory_order_acquire) < n; ++spins) {
      if (spins < 4096) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_.reset();
    }
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  // A forked child has none of the parent's workers, and a lock one of them held at the fork
  // stays locked: the child starts over with fresh locks and no workers (it starts its own
  // if it asks for threads; the core asks for one, see fork_safety.hpp).
  void reset_in_child() {
    new (&busy_) std::mutex;
    new (&mutex_) std::mutex;
    new (&cv_) std::condition_variable;
    new (&job_) std::shared_ptr<Job>;  // the parent's job, if any, is left to leak
    started_ = 0;
    sleeping_ = 0;
  }

  // Called with busy_ held, so by one thread at a time, before the job is published: a new
  // worker takes the generation before it as seen, so it cannot miss the job however late the
  // OS starts it.
  void start_workers(int count) {
    for (; started_ < count; ++started_) {
      std::thread(&Pool::work, this, started_, generation_.load(std::memory_order_relaxed)).detach();
    }
  }

  void work(int index, std::uint64_t seen) {
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + kSpin;
      for (int s = 0; generation_.load(std::memory_order_acquire) == seen; ++s) {
        cpu_relax();
        if (s % 256 == 255 && std::chrono::steady_clock::now() > until) {
          std::unique_lock<std::mutex> lock(mutex_);
          ++sleeping_;
          cv_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
          --sleeping_;
          break;
        }
      }
      std::shared_ptr<Job> job;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        seen = generation_.load(std::memory_order_relaxed);
        job = job_;
      }
      if (!job || index >= job->workers) continue;
      t_in_loop = true;
      job->run_indices();
      t_in_loop = false;
    }
  }

  std::mutex busy_;  // held by the thread whose loop the pool runs
  int started_ = 0;
  std::mutex mutex_;  // guards job_, sleeping_ and the generation's changes
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;
  std::atomic<std::uint64_t> generation_{0};
  int sleeping_ = 0;
};

}  // namespace

void run(std::int64_t n, int threads, IndexFn fn, void* body) {
  if (threads <= 1 || n == 1) return run_serial(n, fn, body);
  Pool::instance()->run(n, threads, fn, body);
}

}  // namespace pool_detail
}  // namespace shardlab
