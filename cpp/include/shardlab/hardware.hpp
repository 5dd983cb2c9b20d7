// Accelerator presets for the cost model: compute, memory and interconnect figures of real
// chips. Every number has a source in docs/hardware.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardlab {

// How the devices of one mesh axis are wired, as the collective scheduler sees them.
//   ring      a torus axis with wraparound, links used in both directions
//   uni_ring  the same ring driven in one direction only (the book's unidirectional case)
//   line      no wraparound: a chain of bidirectional links
//   switch    every device has one egress port into a non-blocking switch (NVLink, InfiniBand
//             fat tree, data-centre network): a hop is one port, never a neighbour chain
enum class Topology { ring, uni_ring, line, switched };

std::string topology_name(Topology t);
Topology parse_topology(const std::string& name);

struct Hardware {
  std::string name;         // preset key, e.g. "tpu-v5e"
  std::string family;       // "tpu" or "gpu"
  std::string description;  // human name, e.g. "TPU v5e"

  // Peak dense FLOP/s per dtype name ("float32", "bfloat16", "int8", "float8"); absent when the
  // vendor publishes no figure.
  std::map<std::string, double> peak_flops;
  double hbm_capacity = 0;   // bytes
  double hbm_bandwidth = 0;  // bytes/s

  // Accelerator interconnect (TPU ICI). Physical axes of the torus, e.g. {"x", "y", "z"}.
  std::vector<std::string> ici_axes;
  double ici_link_bandwidth = 0;  // one-way bytes/s of one link
  int ici_links_per_axis = 0;     // links a chip has along one axis (one to each neighbour)
  int wrap_at = 0;                // an axis wraps when its size equals this (v5e/v6e: 16), 0: never
  int wrap_multiple = 0;          // an axis wraps when its size is a multiple (v4p/v5p: 4), 0: n/a
  double hop_latency = 0;         // seconds per ICI / NVLink hop

  // Data-centre network (TPU slices) per chip.
  double dcn_bandwidth = 0;  // one-way bytes/s per chip
  double dcn_latency = 0;    // seconds per hop

  // GPU node: NVLink inside the node, InfiniBand across nodes.
  int node_size = 0;
  double nvlink_link_bandwidth = 0;  // one-way bytes/s of one NVLink
  int nvlink_links = 0;              // NVLinks per GPU
  double ib_bandwidth = 0;           // one-way bytes/s of the GPU's NIC
  double ib_latency = 0;             // seconds per hop across the fabric

  // Peak FLOP/s for `dtype`; throws std::invalid_argument naming the known dtypes if absent.
  double peak(const std::string& dtype) const;
  bool has_peak(const std::string& dtype) const;
  // Whether a TPU axis of `size` chips closes into a ring.
  bool wraps(std::int64_t size) const;
  // One-way egress bytes/s of a GPU into NVLink (links x per-link bandwidth).
  double nvlink_bandwidth() const { return nvlink_link_bandwidth * nvlink_links; }
};

// All presets, in a fixed order.
const std::vector<Hardware>& hardware_presets();
std::vector<std::string> hardware_names();
// The preset called `name` (case-insensitive; "v5e" and "tpu_v5e" also match "tpu-v5e").
// Throws std::invalid_argument listing the known presets.
const Hardware& get_hardware(const std::string& name);

}  // namespace shardlab
