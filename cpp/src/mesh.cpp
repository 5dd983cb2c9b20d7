#include "shardlab/mesh.hpp"

#include <algorithm>
#include <stdexcept>

namespace shardlab {
namespace {

std::string names_str(const std::vector<std::string>& names) {
  std::string out = "(";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
  return out + (names.size() == 1 ? ",)" : ")");
}

}  // namespace

Mesh::Mesh(std::vector<std::string> axis_names, std::vector<std::int64_t> axis_sizes)
    : names_(std::move(axis_names)), sizes_(std::move(axis_sizes)) {
  if (names_.size() != sizes_.size()) {
    throw std::invalid_argument("[Mesh] " + std::to_string(names_.size()) + " axis names " +
                                names_str(names_) + " for " + std::to_string(sizes_.size()) +
                                " axis sizes; give one name per axis");
  }
  if (names_.empty()) throw std::invalid_argument("[Mesh] a mesh needs at least one axis");
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i].empty()) throw std::invalid_argument("[Mesh] axis names must be non-empty");
    if (std::count(names_.begin(), names_.end(), names_[i]) > 1) {
      throw std::invalid_argument("[Mesh] axis name '" + names_[i] + "' appears twice in " +
                                  names_str(names_));
    }
    if (sizes_[i] <= 0) {
      throw std::invalid_argument("[Mesh] axis '" + names_[i] + "' has size " +
                                  std::to_string(sizes_[i]) + "; sizes must be positive");
    }
    size_ *= sizes_[i];
  }
}

int Mesh::axis_index(const std::string& name, const std::string& op) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) {
    throw std::invalid_argument("[" + op + "] unknown mesh axis '" + name + "'; the mesh has axes " +
                                names_str(names_));
  }
  return static_cast<int>(it - names_.begin());
}

std::int64_t Mesh::device_id(const std::vector<std::int64_t>& coords) const {
  if (coords.size() != sizes_.size()) {
    throw std::invalid_argument("[Mesh.device_id] expected " + std::to_string(sizes_.size()) +
                                " coordinates, got " + std::to_string(coords.size()));
  }
  std::int64_t id = 0;
  for (std::size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= sizes_[i]) {
      throw std::invalid_argument("[Mesh.device_id] coordinate " + std::to_string(coords[i]) +
                                  " is outside axis '" + names_[i] + "' of size " +
                                  std::to_string(sizes_[i]));
    }
    id = id * sizes_[i] + coords[i];
  }
  return id;
}

std::vector<std::int64_t> Mesh::coords(std::int64_t device_id) const {
  if (device_id < 0 || device_id >= size_) {
    throw std::invalid_argument("[Mesh.coords] device id " + std::to_string(device_id) +
                                " is outside a mesh of " + std::to_string(size_) + " devices");
  }
  std::vector<std::int64_t> out(sizes_.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    out[i] = device_id % sizes_[i];
    device_id /= sizes_[i];
  }
  return out;
}

std::int64_t Mesh::group_size(const std::vector<int>& axes) const {
  std::int64_t n = 1;
  for (int a : axes) n *= sizes_.at(a);
  return n;
}

std::vector<std::vector<std::int64_t>> Mesh::groups(const std::vector<int>& axes) const {
  std::vector<int> others;
  for (int i = 0; i < ndim(); ++i) {
    if (std::find(axes.begin(), axes.end(), i) == axes.end()) others.push_back(i);
  }
  const std::int64_t n = group_size(axes), count = size_ / n;
  std::vector<std::vector<std::int64_t>> out(count, std::vector<std::int64_t>(n));
  std::vector<std::int64_t> c(ndim());
  for (std::int64_t g = 0; g < count; ++g) {
    std::int64_t rest = g;
    for (int k = static_cast<int>(others.size()) - 1; k >= 0; --k) {
      c[others[k]] = rest % sizes_[others[k]];
      rest /= sizes_[others[k]];
    }
    for (std::int64_t m = 0; m < n; ++m) {
      std::int64_t r = m;
      for (int k = static_cast<int>(axes.size()) - 1; k >= 0; --k) {
        c[axes[k]] = r % sizes_[axes[k]];
        r /= sizes_[axes[k]];
      }
      out[g][m] = device_id(c);
    }
  }
  return out;
}

std::vector<int> resolve_axes(const Mesh& mesh, const std::vector<std::string>& names,
                              const std::string& op) {
  std::vector<int> out;
  for (const auto& name : names) {
    const int i = mesh.axis_index(name, op);
    if (std::find(out.begin(), out.end(), i) != out.end()) {
      throw std::invalid_argument("[" + op + "] axis '" + name + "' appears twice in " +
                                  names_str(names));
    }
    out.push_back(i);
  }
  return out;
}

}  // namespace shardlab
