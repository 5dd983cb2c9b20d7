#include "shardlab/fork_safety.hpp"

#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace {

// As the core's kernels ask: omp_get_max_threads() threads.
long parallel_sum(long n) {
  long total = 0;
  const int threads = omp_get_max_threads();
#pragma omp parallel for reduction(+ : total) num_threads(threads)
  for (long i = 0; i < n; ++i) total += i;
  return total;
}

}  // namespace

TEST(ForkSafety, AChildForkedAfterAParallelRegionRunsOpenMP) {
  if (omp_get_max_threads() < 2) GTEST_SKIP() << "one OpenMP thread: no team to lose in the child";
  ASSERT_EQ(shardlab::install_fork_handler(), 0);
  ASSERT_EQ(shardlab::install_fork_handler(), 0);  // a second call is harmless
  ASSERT_EQ(parallel_sum(1000), 499500);           // the parent's OpenMP threads now exist
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(parallel_sum(1000) == 499500 ? 0 : 1);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "the forked child hung in its OpenMP region";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(parallel_sum(1000), 499500);
}
