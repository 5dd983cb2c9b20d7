#include "shardlab/buffer_pool.hpp"

#include <gtest/gtest.h>

#include <cstring>

using namespace shardlab;

namespace {

struct CapacityGuard {
  std::size_t saved = pool_capacity();
  ~CapacityGuard() {
    pool_set_capacity(saved);
    pool_release();
  }
};

}  // namespace

TEST(BufferPool, ReusesAFreedBufferOfTheSameSizeClass) {
  CapacityGuard guard;
  pool_release();
  const std::size_t n = (std::size_t{3} << 20) + 123;
  void* a = pool_allocate(n);
  std::memset(a, 7, n);  // the whole request is writable
  pool_free(a, n);
  EXPECT_GE(pool_cached_bytes(), n);
  void* b = pool_allocate(n - 100);  // same size class (3.5 MiB)
  EXPECT_EQ(a, b);
  EXPECT_EQ(pool_cached_bytes(), 0u);
  pool_free(b, n - 100);
}

TEST(BufferPool, ACapacityOfZeroCachesNothingAndReleaseEmptiesTheCache) {
  CapacityGuard guard;
  pool_release();
  const std::size_t n = std::size_t{5} << 20;
  void* a = pool_allocate(n);
  pool_free(a, n);
  EXPECT_GT(pool_cached_bytes(), 0u);
  pool_release();
  EXPECT_EQ(pool_cached_bytes(), 0u);
  pool_set_capacity(0);
  void* b = pool_allocate(n);
  std::memset(b, 1, n);
  pool_free(b, n);  // unmapped at once
  EXPECT_EQ(pool_cached_bytes(), 0u);
}

TEST(BufferPool, SmallRequestsBypassThePool) {
  CapacityGuard guard;
  pool_release();
  void* a = pool_allocate(1000);
  std::memset(a, 0, 1000);
  pool_free(a, 1000);
  EXPECT_EQ(pool_cached_bytes(), 0u);
}
