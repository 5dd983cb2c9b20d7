#include "shardlab/ledger.hpp"

#include <gtest/gtest.h>

using namespace shardlab;

TEST(Ledger, RingClosedForms) {
  const double v = 1 << 20;
  EXPECT_DOUBLE_EQ(ring_bytes_sent("all_gather", 8, v), 7.0 / 8 * v);
  EXPECT_DOUBLE_EQ(ring_bytes_sent("psum_scatter", 4, v), 3.0 / 4 * v);
  EXPECT_DOUBLE_EQ(ring_bytes_sent("psum", 8, v), 2 * 7.0 / 8 * v);
  EXPECT_DOUBLE_EQ(ring_bytes_sent("pmean", 2, v), v);
  EXPECT_DOUBLE_EQ(ring_bytes_sent("all_to_all", 16, v), 15.0 / 16 * v);
  EXPECT_DOUBLE_EQ(ring_bytes_sent("ppermute", 8, v), v);
  EXPECT_DOUBLE_EQ(ring_bytes_sent("all_gather", 1, v), 0.0);
  EXPECT_THROW(ring_bytes_sent("nonsense", 4, v), std::invalid_argument);
  EXPECT_THROW(ring_bytes_sent("psum", 0, v), std::invalid_argument);
}

TEST(Ledger, BusBandwidthFactorsMatchNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("psum", 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_gather", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("psum_scatter", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_to_all", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("broadcast", 8), 1.0);
}

TEST(Ledger, SumsByOpAndAxes) {
  Ledger ledger;
  Event a;
  a.op = "psum";
  a.axes = {"x"};
  a.bytes_sent = 10;
  Event b = a;
  b.op = "all_gather";
  b.axes = {"x", "y"};
  b.bytes_sent = 5;
  ledger.append(a);
  ledger.append(a);
  ledger.append(b);
  EXPECT_EQ(ledger.size(), 3u);
  EXPECT_DOUBLE_EQ(ledger.total_bytes_sent(), 25);
  EXPECT_DOUBLE_EQ(ledger.bytes_sent_by_op().at("psum"), 20);
  EXPECT_DOUBLE_EQ(ledger.bytes_sent_by_axes().at("x,y"), 5);
  ledger.clear();
  EXPECT_EQ(ledger.size(), 0u);
}
