#include "shardlab/fork_safety.hpp"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include "child_process.hpp"

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
  EXPECT_TRUE(shardlab_test::ChildExitsCleanly(pid, "its OpenMP region"));
  EXPECT_EQ(parallel_sum(1000), 499500);
}
