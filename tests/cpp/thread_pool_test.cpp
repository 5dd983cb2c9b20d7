#include "shardlab/thread_pool.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "child_process.hpp"

namespace {

using shardlab::parallel_for;
using shardlab::parallel_for_runs;

// Runs a loop of n indices on `threads` threads and returns how often each index ran.
std::vector<int> run_counts(std::int64_t n, int threads) {
  std::vector<std::atomic<int>> counts(static_cast<std::size_t>(n));
  parallel_for(n, threads, [&](std::int64_t i) { counts[static_cast<std::size_t>(i)].fetch_add(1); });
  std::vector<int> out;
  for (auto& c : counts) out.push_back(c.load());
  return out;
}

}  // namespace

TEST(ThreadPool, EveryIndexRunsExactlyOnceForAnyCountAndThreads) {
  for (int threads : {1, 2, 3, 8}) {
    for (std::int64_t n : {0, 1, 2, 3, 7, 64, 1000, 12345}) {
      const std::vector<int> counts = run_counts(n, threads);
      ASSERT_EQ(counts.size(), static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(counts[static_cast<std::size_t>(i)], 1) << "index " << i << " of " << n << ", threads " << threads;
      }
    }
  }
}

TEST(ThreadPool, ManyLoopsBackToBackGiveTheSameSums) {
  // Thousands of short loops: the path where workers spin between jobs, join late or not at all.
  for (int rep = 0; rep < 3000; ++rep) {
    const std::int64_t n = 1 + rep % 17;
    std::atomic<std::int64_t> sum{0};
    parallel_for(n, 2 + rep % 3, [&](std::int64_t i) { sum.fetch_add(i + 1); });
    ASSERT_EQ(sum.load(), n * (n + 1) / 2) << "loop " << rep;
  }
}

TEST(ThreadPool, UsesMoreThanOneThreadWhenAsked) {
  // Two indices that each wait for the other to start can only finish on two threads at once.
  std::atomic<int> started{0};
  std::atomic<bool> timed_out{false};
  parallel_for(2, 2, [&](std::int64_t) {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_FALSE(timed_out.load()) << "the second index never ran beside the first";
}

TEST(ThreadPool, RunsCoverTheRangeOnceInRunsOfPerWithAShorterLast) {
  for (int threads : {1, 2, 3}) {
    for (std::int64_t n : {0, 1, 5, 64, 1001}) {
      for (std::int64_t per : {-3, 0, 1, 7, 64, 5000}) {
        std::vector<std::atomic<int>> counts(static_cast<std::size_t>(n));
        std::atomic<int> runs{0}, bad{0};
        const std::int64_t step = std::max<std::int64_t>(per, 1);
        parallel_for_runs(n, per, threads, [&](std::int64_t lo, std::int64_t hi) {
          runs.fetch_add(1);
          // Each run starts on a multiple of the run length and is that long, except the last.
          if (lo % step != 0 || hi <= lo || hi != std::min(n, lo + step)) bad.fetch_add(1);
          for (std::int64_t i = lo; i < hi; ++i) counts[static_cast<std::size_t>(i)].fetch_add(1);
        });
        const std::string what = "n " + std::to_string(n) + ", per " + std::to_string(per) + ", threads " +
                                 std::to_string(threads);
        EXPECT_EQ(bad.load(), 0) << what;
        EXPECT_EQ(runs.load(), (n + step - 1) / step) << what;
        for (auto& c : counts) ASSERT_EQ(c.load(), 1) << what;
      }
    }
  }
}

TEST(ThreadPool, TheFirstExceptionIsRethrownAfterEveryIndexRan) {
  for (int threads : {1, 2}) {
    std::atomic<int> ran{0};
    EXPECT_THROW(parallel_for(100, threads,
                              [&](std::int64_t i) {
                                ran.fetch_add(1);
                                if (i % 10 == 3) throw std::runtime_error("index " + std::to_string(i));
                              }),
                 std::runtime_error);
    EXPECT_EQ(ran.load(), 100) << threads << " threads";
  }
  // The pool still works afterwards.
  EXPECT_EQ(run_counts(50, 2), std::vector<int>(50, 1));
}

TEST(ThreadPool, NestedLoopsRunInsideTheirIndex) {
  std::vector<std::atomic<int>> cells(20 * 30);
  parallel_for(20, 2, [&](std::int64_t i) {
    parallel_for(30, 2, [&](std::int64_t j) { cells[static_cast<std::size_t>(i * 30 + j)].fetch_add(1); });
  });
  for (auto& c : cells) ASSERT_EQ(c.load(), 1);
}

TEST(ThreadPool, ALoopFromAnotherThreadRunsWhileThePoolIsHeld) {
  // Thread A's loop holds the pool until thread B's loop has finished: B must not wait for it.
  std::atomic<bool> b_done{false}, a_saw_b{false};
  std::thread a([&] {
    parallel_for(2, 2, [&](std::int64_t i) {
      if (i != 0) return;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!b_done.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      a_saw_b = b_done.load();
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::thread b([&] {
    EXPECT_EQ(run_counts(1000, 2), std::vector<int>(1000, 1));
    b_done = true;
  });
  b.join();
  a.join();
  EXPECT_TRUE(a_saw_b.load());
}

TEST(ThreadPool, AForkedChildStartsItsOwnWorkers) {
  ASSERT_EQ(run_counts(100, 2), std::vector<int>(100, 1));  // the parent's workers exist now
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The parent's workers are gone in the child: it starts its own.
    std::atomic<std::int64_t> sum{0};
    parallel_for(1000, 2, [&](std::int64_t i) { sum.fetch_add(i); });
    _exit(sum.load() == 499500 ? 0 : 1);
  }
  EXPECT_TRUE(shardlab_test::ChildExitsCleanly(pid, "parallel_for"));
}
