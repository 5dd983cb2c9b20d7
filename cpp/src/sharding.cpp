#include "shardlab/sharding.hpp"

#include <algorithm>

namespace shardlab {
std::string spec_str(const PartitionSpec& spec) {
  std::string out = "P(";
  for (std::size_t i = 0; i < spec.size(); ++i) {
    if (i) out += ", ";
    const auto& e = spec[i];
    if (e.empty()) {
      out += "None";
    } else if (e.size() == 1) {
      out += "'" + e[0] + "'";
    } else {
      out += "(";
      for (std::size_t k = 0; k < e.size(); ++k) out += (k ? ", '" : "'") + e[k] + "'";
      out += ")";
    }
  }
  return out + ")";
}

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec)
    : mesh_(std::move(mesh)), spec_(std::move(spec)) {
  std::vector<std::string> seen;
  for (const auto& entry : spec_) {
    for (const auto& name : entry) {
      mesh_.axis_index(name, "NamedSharding");
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
        throw DuplicateSpecError("[NamedSharding] mesh axis '" + name + "' appears twice in " +
                                 spec_str(spec_) + "; a mesh axis can split at most one dimension");
      }
      seen.push_back(name);
    }
  }
}

std::int64_t NamedSharding::dim_split(int dim) const {
  if (dim >= static_cast<int>(spec_.size())) return 1;
  std::int64_t n = 1;
  for (const auto& name : spec_[dim]) n *= mesh_.axis_size(name);
  return n;
}

void NamedSharding::check_shape(const Shape& global, const std::string& op) const {
  if (spec_.size() > global.size()) {
    throw std::invalid_argument("[" + op + "] " + spec_str(spec_) + " has " +
                                std::to_string(spec_.size()) + " entries but the array has rank " +
                                std::to_string(global.size()) + " (shape " + shape_str(global) +
                                "); drop the extra entries");
  }
  for (std::size_t d = 0; d < spec_.size(); ++d) {
    const std::int64_t n = dim_split(static_cast<int>(d));
    if (global[d] % n != 0) {
      throw std::invalid_argument("[" + op + "] dimension " + std::to_string(d) + " of shape " +
                                  shape_str(global) + " has size " + std::to_string(global[d]) +
                                  ", which is not divisible by " + std::to_string(n) +
                                  ", the product of the mesh axes splitting it in " +
                                  spec_str(spec_));
    }
  }
}

Shape NamedSharding::shard_shape(const Shape& global) const {
  check_shape(global, "shard_shape");
  Shape out = global;
  for (std::size_t d = 0; d < spec_.size(); ++d) out[d] /= dim_split(static_cast<int>(d));
  return out;
}

std::vector<std::pair<std::int64_t, std::int64_t>> NamedSharding::device_indices(
    std::int64_t device_id, const Shape& global) const {
  const Shape local = shard_shape(global);
  const auto c = mesh_.coords(device_id);
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::size_t d = 0; d < global.size(); ++d) {
    std::int64_t block = 0;
    if (d < spec_.size()) {
      for (const auto& name : spec_[d]) {
        const int a = mesh_.axis_index(name);
        block = block * mesh_.axis_sizes()[a] + c[a];
      }
    }
    out.emplace_back(block * local[d], (block + 1) * local[d]);
  }
  return out;
}

std::vector<bool> NamedSharding::varying() const {
  std::vector<bool> out(mesh_.ndim(), false);
  for (const auto& entry : spec_) {
    for (const auto& name : entry) out[mesh_.axis_index(name)] = true;
  }
  return out;
}

std::int64_t NamedSharding::replica_id(std::int64_t device_id) const {
  const auto c = mesh_.coords(device_id);
  const auto v = varying();
  std::int64_t id = 0;
  for (int a = 0; a < mesh_.ndim(); ++a) {
    if (!v[a]) id = id * mesh_.axis_sizes()[a] + c[a];
  }
  return id;
}

bool NamedSharding::is_fully_replicated() const {
  for (const auto& entry : spec_) {
    for (const auto& name : entry) {
      if (mesh_.axis_size(name) > 1) return false;
    }
  }
  return true;
}

}  // namespace shardlab
