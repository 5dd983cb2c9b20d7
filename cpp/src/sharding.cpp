#include "shardlab/sharding.hpp"

#include <algorithm>
#include <stdexcept>

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

Shape NamedSharding::storage_shape(const Shape& global) const {
  const Shape local = shard_shape(global);
  const auto v = varying();
  Shape out;
  for (int a = 0; a < mesh_.ndim(); ++a) out.push_back(v[a] ? mesh_.axis_sizes()[a] : 1);
  out.insert(out.end(), local.begin(), local.end());
  return out;
}

Shape NamedSharding::global_shape(const Shape& storage, const std::string& op) const {
  const int k = mesh_.ndim();
  const auto v = varying();
  bool ok = static_cast<int>(storage.size()) >= k + static_cast<int>(spec_.size());
  for (int a = 0; ok && a < k; ++a) ok = storage[a] == (v[a] ? mesh_.axis_sizes()[a] : 1);
  if (!ok) {
    Shape mesh_dims;
    for (int a = 0; a < k; ++a) mesh_dims.push_back(v[a] ? mesh_.axis_sizes()[a] : 1);
    throw std::invalid_argument("[" + op + "] storage of shape " + shape_str(storage) +
                                " does not belong to " + spec_str(spec_) + ": it needs the mesh dims " +
                                shape_str(mesh_dims) + " followed by at least " +
                                std::to_string(spec_.size()) + " local dims");
  }
  Shape out(storage.begin() + k, storage.end());
  for (std::size_t d = 0; d < out.size(); ++d) out[d] *= dim_split(static_cast<int>(d));
  return out;
}

ArrayRef NamedSharding::storage_view(const ArrayRef& global, const std::string& op) const {
  check_shape(global.shape, op);
  const int k = mesh_.ndim();
  ArrayRef out{global.data, global.dtype, Shape(k, 1), Shape(k, 0)};
  for (int d = 0; d < global.ndim(); ++d) {
    const std::int64_t local = global.shape[d] / dim_split(d);
    out.shape.push_back(local);
    out.strides.push_back(global.strides[d]);
    if (d >= static_cast<int>(spec_.size())) continue;
    // Axes major-to-minor: the minor axis steps one block, each major one a block of blocks.
    std::int64_t step = global.strides[d] * local;
    for (auto it = spec_[d].rbegin(); it != spec_[d].rend(); ++it) {
      const int a = mesh_.axis_index(*it);
      out.shape[a] = mesh_.axis_sizes()[a];
      out.strides[a] = step;
      step *= mesh_.axis_sizes()[a];
    }
  }
  return out;
}

ArrayRef local_view(const Mesh& mesh, const ArrayRef& storage, std::int64_t device_id) {
  const int k = mesh.ndim();
  if (storage.ndim() < k) {
    throw std::invalid_argument("[local_view] storage of shape " + shape_str(storage.shape) +
                                " has fewer dims than the mesh's " + std::to_string(k));
  }
  const auto c = mesh.coords(device_id);
  ArrayRef out{storage.data, storage.dtype, Shape(storage.shape.begin() + k, storage.shape.end()),
               Shape(storage.strides.begin() + k, storage.strides.end())};
  for (int a = 0; a < k; ++a) {
    if (storage.shape[a] == 1) continue;
    if (storage.shape[a] != mesh.axis_sizes()[a]) {
      throw std::invalid_argument("[local_view] storage dim " + std::to_string(a) + " has size " +
                                  std::to_string(storage.shape[a]) + "; it must be 1 or the size " +
                                  std::to_string(mesh.axis_sizes()[a]) + " of axis '" +
                                  mesh.axis_names()[a] + "'");
    }
    out.data = static_cast<char*>(out.data) + c[a] * storage.strides[a];
  }
  return out;
}

}  // namespace shardlab
