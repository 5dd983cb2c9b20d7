// The ledger: one event per collective or compute call, with exact bytes.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "shardlab/dtype.hpp"

namespace shardlab {

struct Event {
  std::string op;                  // "all_gather", "psum", ..., or "matmul" / "attention"
  std::vector<std::string> axes;   // mesh axes the collective runs over, major-to-minor
  std::int64_t group_size = 1;     // devices per group (product of the axes' sizes)
  std::int64_t num_groups = 1;     // independent groups (mesh size / group size)
  DType dtype = DType::float32;
  std::int64_t bytes_in = 0;       // per device, before
  std::int64_t bytes_out = 0;      // per device, after
  double bytes_sent = 0;           // per device, under the algorithm named by `algorithm`
  std::string algorithm = "ring";
  double flops = 0;                // per device, compute events
  double hbm_bytes = 0;            // per device, compute events
  double seconds = std::numeric_limits<double>::quiet_NaN();  // filled by the cost model
};

// Bytes each device sends for `op` over a group of n devices, where `full_bytes` is V in
// nccl-tests' terms: the gathered array for all_gather / gather, the unscattered array for
// psum_scatter / scatter, the per-device array for the others.
//   all_gather, psum_scatter, all_to_all, gather, scatter: (n-1)/n V
//   psum / pmean / pmax / pmin (ring AllReduce = ReduceScatter + AllGather): 2 (n-1)/n V
//   ppermute: V;  broadcast and reduce (pipelined chain): V;  any op with n == 1: 0.
double ring_bytes_sent(const std::string& op, std::int64_t n, double full_bytes);

// nccl-tests' bus-bandwidth factor: busbw = algbw * factor(op, n).
double bus_bandwidth_factor(const std::string& op, std::int64_t n);

class Ledger {
 public:
  void append(Event event) { events_.push_back(std::move(event)); }
  const std::vector<Event>& events() const { return events_; }
  void clear() { events_.clear(); }
  std::size_t size() const { return events_.size(); }

  double total_bytes_sent() const;
  // Bytes sent per device summed by op name, and by axis tuple (joined with ",").
  std::map<std::string, double> bytes_sent_by_op() const;
  std::map<std::string, double> bytes_sent_by_axes() const;

  // One line per event (op, axes, group size x groups, dtype, bytes in / out / sent per
  // device, seconds when the cost model filled them) and a total line; for printing.
  std::string table() const;

 private:
  std::vector<Event> events_;
};

}  // namespace shardlab
