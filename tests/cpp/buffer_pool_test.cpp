#include "shardlab/buffer_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

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

TEST(BufferPool, RefusesARequestLargerThanThisMachineWithTheOpAndTheSize) {
  try {
    pool_allocate(std::size_t{1} << 60, "all_gather");
    FAIL() << "a 2**60-byte request was not refused";
  } catch (const AllocationError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[all_gather] needs 1073741824 GiB, more than the ", 0), 0u) << msg;
    EXPECT_NE(msg.find(" GiB this machine has"), std::string::npos) << msg;
  }
}

TEST(BufferPool, CheckedBytesRefusesAShapeWhoseByteCountOverflows) {
  // 2**31 * 2**31 * 4 bytes = 2**64: wraps to 0 in size_t arithmetic, refused here.
  EXPECT_THROW(checked_bytes("broadcast", {std::int64_t{1} << 31, std::int64_t{1} << 31}, 4), AllocationError);
  EXPECT_EQ(checked_bytes("broadcast", {3, 5}, 4), 60u);
  try {
    checked_bytes("copy", {std::int64_t{1} << 33}, 4, "shard it");
    if (physical_memory_bytes() < 32.0 * (1 << 30)) FAIL() << "32 GiB passed on a smaller machine";
  } catch (const AllocationError& e) {
    EXPECT_STREQ(std::string(e.what()).substr(0, 19).c_str(), "[copy] needs 32 GiB");
    EXPECT_NE(std::string(e.what()).find("; shard it"), std::string::npos) << e.what();
  }
}

TEST(BufferPool, AlignedAllocateChecksFirstAndAligns) {
  void* p = aligned_allocate("gemm", 64, 100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
  std::free(p);
  EXPECT_THROW(aligned_allocate("gemm", 64, std::size_t{1} << 62), AllocationError);
}
