// Collective time model: the book's closed forms and a link-level scheduler that runs the ring /
// torus algorithms step by step and counts the bytes on every directed link.
//
// Conventions. `bytes` is V, the size of the array the collective works on within ONE group:
// the gathered result for AllGather, the unreduced input for ReduceScatter / AllReduce, the
// whole (group-wide) array for AllToAll, the per-device message for ppermute and broadcast /
// reduce, the gathered result for gather / scatter. Every group along the other mesh axes runs
// at the same time on its own links, so one group's time is the collective's time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardlab/hardware.hpp"
#include "shardlab/ops.hpp"

namespace shardlab {

// Collective, collective_name and parse_collective live in ops.hpp with the op names.

// One mesh axis as wired on the machine.
struct AxisLinks {
  std::int64_t size = 1;
  Topology topology = Topology::ring;
  double link_bandwidth = 0;  // one-way bytes/s of one link (switch: of one egress port)
  double hop_latency = 0;     // seconds
  std::string label;          // e.g. "X (ici x)" for messages
};

// Bytes counted on one directed link: src -> dst along the axis (dst == -1: src's switch port).
struct LinkCount {
  std::int64_t src = 0;
  std::int64_t dst = 0;
  double bytes = 0;
};

// The step-by-step schedule of a collective on a single axis.
struct AxisSchedule {
  Collective op = Collective::all_gather;
  std::int64_t size = 1;
  Topology topology = Topology::ring;
  double bytes = 0;                     // V as defined above
  std::int64_t steps = 0;               // hops on the critical path
  std::vector<double> step_max_bytes;   // busiest link's bytes in each step
  std::vector<LinkCount> links;         // total bytes per directed link (links that carried any)
  double max_link_bytes = 0;            // busiest link over the whole collective
  double total_link_bytes = 0;          // sum over all links (bytes x hops)
};

// Runs the algorithm: ring AllGather forwards each shard hop by hop (both ways on a
// bidirectional ring, the antipodal shard split in halves); ReduceScatter is its time reversal;
// AllReduce is ReduceScatter then AllGather; AllToAll and ppermute route every block on a
// shortest path; broadcast / reduce pipeline from / to the root; gather / scatter route shards
// to / from the root. `perm` (ppermute only) lists (source, destination) pairs; empty means
// a shift by one. Throws std::invalid_argument on a bad size, bytes or permutation.
AxisSchedule schedule_axis(Collective op, std::int64_t size, Topology topology, double bytes,
                           const std::vector<std::pair<std::int64_t, std::int64_t>>& perm = {},
                           std::int64_t root = 0);

// Time of a collective over one or more axes from the link-level schedules.
// T = max(latency, bandwidth): latency = sum over axes of hops x hop latency (the book's
// latency floor); bandwidth = max over axes of (bytes on the axis's busiest link) / link
// bandwidth. Over several axes the array is split among gather orders (each single order and an
// even split over the cyclic rotations are tried, the fastest is kept).
struct CollectiveTime {
  double seconds = 0;
  double bandwidth_seconds = 0;
  double latency_seconds = 0;
  std::int64_t hops = 0;
  std::vector<double> axis_link_bytes;  // bytes on the busiest link of each axis
  std::string plan;                     // which order / split was kept
};

CollectiveTime collective_time(Collective op, double bytes, const std::vector<AxisLinks>& axes,
                               const std::vector<std::pair<std::int64_t, std::int64_t>>& perm = {});

// The book's headline hand formulas (part 3 of "How to Scale Your Model"). They assume every
// torus axis wraps, so a line is priced as a ring here; the link-level model is the correction.
//   AllGather / ReduceScatter  V / (sum of bidirectional axis bandwidths)   W_bidi = 2 W
//                              unidirectional ring: V / W; switched axes: hierarchical max
//                              (each level sees V divided by the faster levels below it)
//   AllReduce                  2 x AllGather
//   AllToAll                   V max_i(n_i) / (4 N W_bidi) on rings (1/4 of AllGather in 1-D),
//                              1/2 of AllGather on a unidirectional ring, V / (N W) on a switch
//   ppermute                   V / W (one neighbour)
//   latency floor              hop latency x sum n_i / 2 (n - 1 on a unidirectional ring)
//   T = max(latency, bandwidth). `available` is false for ops the book gives no formula for.
struct BookTime {
  bool available = false;
  double seconds = 0;
  double bandwidth_seconds = 0;
  double latency_seconds = 0;
};

BookTime book_collective_time(Collective op, double bytes, const std::vector<AxisLinks>& axes);

}  // namespace shardlab
