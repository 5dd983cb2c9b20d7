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

// The figures of a chip, listed once: X(type, field, kind, comment). The Hardware struct below
// and the Python binding's attributes are made from this list, and _core.hardware_fields()
// hands it to Python as (field, kind, comment) rows, where kind is the Python type ("str",
// "float", "int", "dict" for peak_flops, "tuple" for ici_axes); the Python Hardware
// dataclass (shardlab._src.core.hardware) is checked against it field for field.
#define SHARDLAB_HARDWARE_FIELDS(X)                                                                      \
  X(std::string, name, "str", "preset key, e.g. \"tpu-v5e\"")                                           \
  X(std::string, family, "str", "\"tpu\" or \"gpu\"")                                                  \
  X(std::string, description, "str", "human name, e.g. \"TPU v5e\"")                                    \
  /* Peak dense FLOP/s per dtype name ("float32", "bfloat16", "int8", "float8"); absent when the */      \
  /* vendor publishes no figure. */                                                                      \
  X(PeakFlops, peak_flops, "dict", "peak dense FLOP/s per dtype name")                                    \
  X(double, hbm_capacity, "float", "bytes")                                                              \
  X(double, hbm_bandwidth, "float", "bytes/s")                                                           \
  /* Accelerator interconnect (TPU ICI). */                                                              \
  X(AxisNames, ici_axes, "tuple", "physical axes of the torus, e.g. (x, y, z)")                           \
  X(double, ici_link_bandwidth, "float", "one-way bytes/s of one link")                                  \
  X(int, ici_links_per_axis, "int", "links a chip has along one axis (one to each neighbour)")            \
  X(int, wrap_at, "int", "an axis wraps when its size equals this (v5e/v6e: 16), 0: never")             \
  X(int, wrap_multiple, "int", "an axis wraps when its size is a multiple (v4p/v5p: 4), 0: n/a")          \
  X(double, hop_latency, "float", "seconds per ICI / NVLink hop")                                        \
  /* Data-centre network (TPU slices) per chip. */                                                       \
  X(double, dcn_bandwidth, "float", "one-way bytes/s per chip")                                          \
  X(double, dcn_latency, "float", "seconds per hop")                                                     \
  /* GPU node: NVLink inside the node, InfiniBand across nodes. */                                       \
  X(int, node_size, "int", "GPUs per node")                                                              \
  X(double, nvlink_link_bandwidth, "float", "one-way bytes/s of one NVLink")                             \
  X(int, nvlink_links, "int", "NVLinks per GPU")                                                         \
  X(double, ib_bandwidth, "float", "one-way bytes/s of the GPU's NIC")                                   \
  X(double, ib_latency, "float", "seconds per hop across the fabric")

struct Hardware {
  using PeakFlops = std::map<std::string, double>;
  using AxisNames = std::vector<std::string>;
#define SHARDLAB_HARDWARE_FIELD(type, field, kind, comment) type field{};
  SHARDLAB_HARDWARE_FIELDS(SHARDLAB_HARDWARE_FIELD)
#undef SHARDLAB_HARDWARE_FIELD

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
