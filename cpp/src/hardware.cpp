#include "shardlab/hardware.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace shardlab {

std::string topology_name(Topology t) {
  switch (t) {
    case Topology::ring: return "ring";
    case Topology::uni_ring: return "uni_ring";
    case Topology::line: return "line";
    case Topology::switched: return "switch";
  }
  return "?";
}

Topology parse_topology(const std::string& name) {
  if (name == "ring" || name == "torus" || name == "bidirectional") return Topology::ring;
  if (name == "uni_ring" || name == "unidirectional") return Topology::uni_ring;
  if (name == "line") return Topology::line;
  if (name == "switch" || name == "switched") return Topology::switched;
  throw std::invalid_argument("[topology] unknown topology '" + name +
                              "': use 'ring', 'uni_ring', 'line' or 'switch'");
}

double Hardware::peak(const std::string& dtype) const {
  auto it = peak_flops.find(dtype);
  if (it != peak_flops.end()) return it->second;
  std::string known;
  for (const auto& [k, v] : peak_flops) known += (known.empty() ? "" : ", ") + k;
  throw std::invalid_argument("[hardware] " + name + " has no published peak FLOP/s for dtype '" +
                              dtype + "'; known: " + known);
}

bool Hardware::has_peak(const std::string& dtype) const { return peak_flops.count(dtype) > 0; }

bool Hardware::wraps(std::int64_t size) const {
  if (size < 3) return false;  // a ring of 2 has the same single link pair as a line of 2
  if (wrap_at > 0 && size == wrap_at) return true;
  if (wrap_multiple > 0 && size % wrap_multiple == 0) return true;
  return false;
}

namespace {

// Figures and their sources: docs/hardware.md. TPU numbers follow the book's part 2 tables
// (jax-ml.github.io/scaling-book/tpus), GPU numbers NVIDIA's datasheets (dense, no sparsity).
Hardware tpu(std::string name, std::string desc, double bf16, double int8, double hbm, double hbm_bw,
             int ici_dims, double link_bw, int wrap_at, int wrap_multiple, double dcn_bw) {
  Hardware h;
  h.name = std::move(name);
  h.family = "tpu";
  h.description = std::move(desc);
  h.peak_flops = {{"bfloat16", bf16}, {"int8", int8}};
  h.hbm_capacity = hbm;
  h.hbm_bandwidth = hbm_bw;
  h.ici_axes = ici_dims == 3 ? std::vector<std::string>{"x", "y", "z"}
                             : std::vector<std::string>{"x", "y"};
  h.ici_link_bandwidth = link_bw;
  h.ici_links_per_axis = 2;
  h.wrap_at = wrap_at;
  h.wrap_multiple = wrap_multiple;
  h.hop_latency = 1e-6;
  h.dcn_bandwidth = dcn_bw;
  h.dcn_latency = 1e-5;
  return h;
}

// `nvlink_links` links of `nvlink_link_bw` bytes/s per direction each; `ib_bw` bytes/s of
// InfiniBand per GPU (one 400 Gb/s ConnectX-7 NIC per GPU on H100/H200/B200 nodes).
Hardware gpu(std::string name, std::string desc, std::map<std::string, double> flops, double hbm,
             double hbm_bw, double nvlink_link_bw, int nvlink_links = 18, double ib_bw = 50e9) {
  Hardware h;
  h.name = std::move(name);
  h.family = "gpu";
  h.description = std::move(desc);
  h.peak_flops = std::move(flops);
  h.hbm_capacity = hbm;
  h.hbm_bandwidth = hbm_bw;
  h.node_size = 8;
  h.nvlink_link_bandwidth = nvlink_link_bw;
  h.nvlink_links = nvlink_links;
  h.hop_latency = 1e-6;
  h.ib_bandwidth = ib_bw;
  h.ib_latency = 2e-6;
  return h;
}

std::vector<Hardware> make_presets() {
  std::vector<Hardware> v;
  v.push_back(tpu("tpu-v4p", "TPU v4p", 2.75e14, 2.75e14, 32e9, 1.2e12, 3, 4.5e10, 0, 4, 6.25e9));
  v.push_back(tpu("tpu-v5e", "TPU v5e", 1.97e14, 3.94e14, 16e9, 8.2e11, 2, 4.5e10, 16, 0, 3.125e9));
  v.push_back(tpu("tpu-v5p", "TPU v5p", 4.59e14, 9.18e14, 96e9, 2.8e12, 3, 9e10, 0, 4, 6.25e9));
  v.push_back(tpu("tpu-v6e", "TPU v6e (Trillium)", 9.2e14, 1.84e15, 32e9, 1.6e12, 2, 9e10, 16, 0,
                  12.5e9));
  // A100 SXM 80GB: NVLink 3 (12 links x 25 GB/s per direction), 8 x 200 Gb/s HDR InfiniBand
  // per 8-GPU node as on Selene (25 GB/s per GPU).
  v.push_back(gpu("a100", "NVIDIA A100 SXM 80GB",
                  {{"float32", 1.95e13}, {"bfloat16", 3.12e14}, {"float16", 3.12e14}, {"int8", 6.24e14}},
                  80e9, 2.039e12, 25e9, 12, 25e9));
  v.push_back(gpu("h100", "NVIDIA H100 SXM",
                  {{"float32", 6.7e13}, {"bfloat16", 9.89e14}, {"float8", 1.979e15},
                   {"int8", 1.979e15}},
                  80e9, 3.35e12, 25e9));
  v.push_back(gpu("h200", "NVIDIA H200 SXM",
                  {{"float32", 6.7e13}, {"bfloat16", 9.89e14}, {"float8", 1.979e15},
                   {"int8", 1.979e15}},
                  141e9, 4.8e12, 25e9));
  v.push_back(gpu("b200", "NVIDIA B200",
                  {{"float32", 8e13}, {"bfloat16", 2.25e15}, {"float8", 4.5e15},
                   {"int8", 4.5e15}, {"float4", 9e15}},
                  192e9, 8e12, 50e9));
  return v;
}

std::string normalize(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) {
    return c == '_' ? '-' : static_cast<char>(std::tolower(c));
  });
  if (s.rfind("tpu-", 0) != 0 && s.size() >= 2 && s[0] == 'v' && std::isdigit(s[1])) s = "tpu-" + s;
  if (s.rfind("nvidia-", 0) == 0) s = s.substr(7);
  return s;
}

}  // namespace

const std::vector<Hardware>& hardware_presets() {
  static const std::vector<Hardware> presets = make_presets();
  return presets;
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> names;
  for (const auto& h : hardware_presets()) names.push_back(h.name);
  return names;
}

const Hardware& get_hardware(const std::string& name) {
  const std::string key = normalize(name);
  for (const auto& h : hardware_presets())
    if (h.name == key) return h;
  std::string known;
  for (const auto& n : hardware_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("[hardware] unknown preset '" + name + "'; known presets: " + known);
}

}  // namespace shardlab
