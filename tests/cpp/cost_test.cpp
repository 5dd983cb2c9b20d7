#include "shardlab/cost.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>

namespace shardlab {
namespace {

constexpr double kRel = 1e-12;

AxisLinks axis(std::int64_t n, Topology t, double w = 1.0, double lat = 0.0) {
  return AxisLinks{n, t, w, lat, "a" + std::to_string(n)};
}

// Problem 10 of part 3: an N x N array of scalars (1 byte each) on a ring of D devices.
TEST(Schedule, UnidirectionalRingAllGatherMovesNSquaredOneMinusOneOverD) {
  for (std::int64_t d : {2, 3, 4, 5, 8, 16}) {
    const double n2 = 64.0 * 64.0;
    const auto s = schedule_axis(Collective::all_gather, d, Topology::uni_ring, n2);
    ASSERT_EQ(static_cast<std::int64_t>(s.links.size()), d);  // every i -> i+1 link, used equally
    for (const auto& l : s.links) EXPECT_NEAR(l.bytes, n2 * (1 - 1.0 / d), n2 * kRel);
    EXPECT_EQ(s.steps, d - 1);
    for (double b : s.step_max_bytes) EXPECT_NEAR(b, n2 / d, n2 * kRel);
  }
}

TEST(Schedule, UnidirectionalRingAllToAllMovesHalfOfAllGather) {
  for (std::int64_t d : {2, 3, 4, 6, 8, 16}) {
    const double n2 = 96.0 * 96.0;
    const auto a2a = schedule_axis(Collective::all_to_all, d, Topology::uni_ring, n2);
    const auto ag = schedule_axis(Collective::all_gather, d, Topology::uni_ring, n2);
    EXPECT_NEAR(a2a.max_link_bytes, n2 / 2 * (1 - 1.0 / d), n2 * kRel) << d;
    EXPECT_NEAR(a2a.max_link_bytes / ag.max_link_bytes, 0.5, kRel) << d;
  }
}

TEST(Schedule, BidirectionalRingHalvesAllGatherAndQuartersAllToAll) {
  for (std::int64_t d : {3, 4, 5, 8, 9, 16}) {
    const double v = 1 << 20;
    const auto ag = schedule_axis(Collective::all_gather, d, Topology::ring, v);
    const auto uni = schedule_axis(Collective::all_gather, d, Topology::uni_ring, v);
    EXPECT_NEAR(ag.max_link_bytes, uni.max_link_bytes / 2, v * kRel) << d;
    EXPECT_EQ(ag.steps, d / 2) << d;
    const auto a2a = schedule_axis(Collective::all_to_all, d, Topology::ring, v);
    // Even D: exactly V/8 per directed link, i.e. V / (4 W_bidi) -- 1/4 of the bidirectional
    // AllGather's V / W_bidi. Odd D: V (D^2 - 1) / (8 D^2).
    const double want = d % 2 == 0 ? v / 8 : v * (d * d - 1.0) / (8.0 * d * d);
    EXPECT_NEAR(a2a.max_link_bytes, want, v * kRel) << d;
    // Uni -> bi: AllGather gains 2x, AllToAll about 4x.
    const auto a2a_uni = schedule_axis(Collective::all_to_all, d, Topology::uni_ring, v);
    if (d % 2 == 0) EXPECT_NEAR(a2a_uni.max_link_bytes / a2a.max_link_bytes, 4.0 * (d - 1) / d, 1e-9);
  }
}

TEST(Schedule, LineWithoutWraparoundLoadsTheEdgeLinks) {
  for (std::int64_t d : {2, 3, 4, 8}) {
    const double v = 4096;
    const auto s = schedule_axis(Collective::all_gather, d, Topology::line, v);
    EXPECT_NEAR(s.max_link_bytes, v * (d - 1) / d, v * kRel);  // the book's (n-1) x shard
    EXPECT_EQ(s.steps, d - 1);
    for (const auto& l : s.links) EXPECT_NE(l.dst, -1);
  }
}

TEST(Schedule, EveryDeviceReceivesEachForeignShardOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const std::int64_t d = 2 + rng() % 15;
    const double v = 1000.0 + rng() % 100000;
    for (Topology t : {Topology::ring, Topology::uni_ring, Topology::line, Topology::switched}) {
      const auto ag = schedule_axis(Collective::all_gather, d, t, v);
      EXPECT_NEAR(ag.total_link_bytes, (d - 1) * v, v * 1e-9);
      const auto rs = schedule_axis(Collective::reduce_scatter, d, t, v);
      EXPECT_NEAR(rs.max_link_bytes, ag.max_link_bytes, v * 1e-9);
      EXPECT_EQ(rs.steps, ag.steps);
      const auto ar = schedule_axis(Collective::all_reduce, d, t, v);
      EXPECT_NEAR(ar.total_link_bytes, 2 * ag.total_link_bytes, v * 1e-9);
      EXPECT_EQ(ar.steps, 2 * ag.steps);
      // On a line the two phases load opposite directions of the edge links, so the busiest
      // link carries V, not 2 (n-1)/n V; the phases still run one after the other.
      if (t != Topology::line) EXPECT_NEAR(ar.max_link_bytes, 2 * ag.max_link_bytes, v * 1e-9);
      else EXPECT_NEAR(ar.max_link_bytes, v, v * 1e-9);
      std::vector<AxisLinks> one = {axis(d, t, 1.0)};
      EXPECT_NEAR(collective_time(Collective::all_reduce, v, one).bandwidth_seconds,
                  2 * collective_time(Collective::all_gather, v, one).bandwidth_seconds, v * 1e-9);
    }
  }
}

TEST(Schedule, SwitchAllToAllIsOneHop) {
  const double v = 8 * 8 * 100;
  const auto s = schedule_axis(Collective::all_to_all, 8, Topology::switched, v);
  EXPECT_EQ(s.steps, 1);
  EXPECT_NEAR(s.max_link_bytes, v * 7 / 64, v * kRel);
}

TEST(Schedule, PpermuteShiftAndReverse) {
  const double v = 1000;
  auto ring = schedule_axis(Collective::ppermute, 8, Topology::ring, v);
  EXPECT_NEAR(ring.max_link_bytes, v, kRel);
  EXPECT_EQ(ring.steps, 1);
  // On a line the wrap pair (7 -> 0) walks back over every link.
  auto line = schedule_axis(Collective::ppermute, 8, Topology::line, v);
  EXPECT_NEAR(line.max_link_bytes, v, kRel);
  EXPECT_EQ(line.steps, 7);
  auto swap = schedule_axis(Collective::ppermute, 4, Topology::ring, v, {{0, 2}, {2, 0}});
  EXPECT_NEAR(swap.max_link_bytes, v / 2, kRel);  // antipodal: half each way
  EXPECT_EQ(swap.steps, 2);
}

TEST(Schedule, RootedCollectives) {
  const double v = 800;
  auto b = schedule_axis(Collective::broadcast, 8, Topology::ring, v);
  EXPECT_NEAR(b.max_link_bytes, v / 2, kRel);
  EXPECT_EQ(b.steps, 7);
  auto r = schedule_axis(Collective::reduce, 8, Topology::ring, v, {}, 3);
  EXPECT_NEAR(r.max_link_bytes, v / 2, kRel);
  auto g = schedule_axis(Collective::gather, 8, Topology::uni_ring, v);
  EXPECT_NEAR(g.total_link_bytes, v / 8 * (1 + 2 + 3 + 4 + 5 + 6 + 7), 1e-9);
  auto sc = schedule_axis(Collective::scatter, 8, Topology::uni_ring, v);
  EXPECT_NEAR(sc.total_link_bytes, g.total_link_bytes, 1e-9);
}

TEST(Schedule, BadInput) {
  EXPECT_THROW(schedule_axis(Collective::all_gather, 0, Topology::ring, 1), std::invalid_argument);
  EXPECT_THROW(schedule_axis(Collective::all_gather, 4, Topology::ring, -1), std::invalid_argument);
  EXPECT_THROW(schedule_axis(Collective::ppermute, 4, Topology::ring, 1, {{0, 1}, {0, 2}}),
               std::invalid_argument);
  EXPECT_THROW(schedule_axis(Collective::ppermute, 4, Topology::ring, 1, {{0, 1}, {2, 1}}),
               std::invalid_argument);
  EXPECT_THROW(schedule_axis(Collective::ppermute, 4, Topology::ring, 1, {{0, 4}}),
               std::invalid_argument);
  EXPECT_THROW(schedule_axis(Collective::all_gather, 4, Topology::ring, 1, {{0, 1}}),
               std::invalid_argument);
  EXPECT_THROW(parse_collective("all_scatter"), std::invalid_argument);
  EXPECT_THROW(collective_time(Collective::all_gather, 1, {axis(4, Topology::ring, 0.0)}),
               std::invalid_argument);
}

TEST(CollectiveTime, SingleAxisIsExactBookTimesNMinusOneOverN) {
  for (std::int64_t d : {4, 8, 16}) {
    const double v = 1e8, w = 4.5e10;
    auto t = collective_time(Collective::all_gather, v, {axis(d, Topology::ring, w)});
    auto book = book_collective_time(Collective::all_gather, v, {axis(d, Topology::ring, w)});
    EXPECT_NEAR(book.bandwidth_seconds, v / (2 * w), 1e-15);
    EXPECT_NEAR(t.bandwidth_seconds, book.bandwidth_seconds * (d - 1) / d, 1e-15);
    auto ar = collective_time(Collective::all_reduce, v, {axis(d, Topology::ring, w)});
    EXPECT_NEAR(ar.seconds, 2 * t.seconds, 1e-15);
  }
}

TEST(CollectiveTime, LatencyFloorIsHopsTimesHopLatency) {
  const double lat = 1e-6;
  auto t = collective_time(Collective::all_gather, 256, {axis(4, Topology::ring, 4.5e10, lat)});
  EXPECT_EQ(t.hops, 2);
  EXPECT_DOUBLE_EQ(t.seconds, 2 * lat);
  auto line = collective_time(Collective::all_gather, 256, {axis(4, Topology::line, 4.5e10, lat)});
  EXPECT_DOUBLE_EQ(line.seconds, 3 * lat);
}

TEST(CollectiveTime, TwoTorusAxesUseBothLinks) {
  const double v = 1 << 24, w = 1.0;
  auto t = collective_time(Collective::all_gather, v,
                           {axis(4, Topology::ring, w), axis(4, Topology::ring, w)});
  // Even split over the two rotations: each axis carries 3/8 (V/8 + V/2) on its busiest link.
  EXPECT_NEAR(t.bandwidth_seconds, 15.0 * v / 64, v * kRel);
  auto book = book_collective_time(Collective::all_gather, v,
                                   {axis(4, Topology::ring, w), axis(4, Topology::ring, w)});
  EXPECT_NEAR(book.bandwidth_seconds, v / 4, v * kRel);  // V / (W_bidi x 2 axes)
}

TEST(CollectiveTime, NdAllToAllMatchesTheBookOnEvenRings) {
  const double v = 1 << 20, w = 1.0;
  std::vector<AxisLinks> axes = {axis(4, Topology::ring, w), axis(8, Topology::ring, w)};
  auto t = collective_time(Collective::all_to_all, v, axes);
  auto book = book_collective_time(Collective::all_to_all, v, axes);
  EXPECT_NEAR(t.bandwidth_seconds, v * 8 / (4 * 32 * 2 * w), v * kRel);
  EXPECT_NEAR(book.bandwidth_seconds, t.bandwidth_seconds, v * kRel);
}

TEST(CollectiveTime, HierarchicalGpuGatherGoesSlowAxisFirst) {
  // 4 nodes x 8 GPUs: IB 50 GB/s per GPU, NVLink 450 GB/s per GPU.
  const double v = 1e9;
  std::vector<AxisLinks> axes = {axis(4, Topology::switched, 50e9), axis(8, Topology::switched, 450e9)};
  auto t = collective_time(Collective::all_gather, v, axes);
  EXPECT_NEAR(t.bandwidth_seconds, std::max(v * 3 / 4 / 8 / 50e9, v * 7 / 8 / 450e9), 1e-15);
  auto book = book_collective_time(Collective::all_gather, v, axes);
  EXPECT_NEAR(book.bandwidth_seconds, v / 400e9, 1e-15);  // bytes / node egress
}

TEST(CollectiveTime, MultiAxisPpermuteRoutesPerLine) {
  std::vector<AxisLinks> axes = {axis(2, Topology::line), axis(4, Topology::ring)};
  auto t = collective_time(Collective::ppermute, 100, axes, {{0, 1}, {1, 0}});
  EXPECT_NEAR(t.bandwidth_seconds, 100, kRel);
  auto cross = collective_time(Collective::ppermute, 100, axes, {{0, 4}, {4, 0}});
  EXPECT_NEAR(cross.axis_link_bytes[0], 100, kRel);
  EXPECT_NEAR(cross.axis_link_bytes[1], 0, kRel);
}

TEST(CollectiveTime, GrowsWithBytes) {
  std::vector<AxisLinks> axes = {axis(8, Topology::line, 4.5e10, 1e-6)};
  double prev = 0;
  for (double v = 1; v < 1e10; v *= 3) {
    for (Collective op : {Collective::all_gather, Collective::all_to_all, Collective::all_reduce}) {
      auto t = collective_time(op, v, axes);
      EXPECT_GE(t.seconds, 0);
    }
    auto t = collective_time(Collective::all_gather, v, axes);
    EXPECT_GE(t.seconds, prev);
    prev = t.seconds;
  }
}

}  // namespace
}  // namespace shardlab
