// A mesh of virtual devices: named axes, row-major device ids, coordinates and device groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardlab {

class Mesh {
 public:
  // Throws std::invalid_argument for an empty or duplicate axis name, a non-positive size, or
  // names and sizes of different lengths.
  Mesh(std::vector<std::string> axis_names, std::vector<std::int64_t> axis_sizes);

  const std::vector<std::string>& axis_names() const { return names_; }
  const std::vector<std::int64_t>& axis_sizes() const { return sizes_; }
  int ndim() const { return static_cast<int>(names_.size()); }
  std::int64_t size() const { return size_; }

  // Index of `name` in axis_names(); throws std::invalid_argument naming the op and the axis.
  int axis_index(const std::string& name, const std::string& op = "mesh") const;
  std::int64_t axis_size(const std::string& name) const { return sizes_[axis_index(name)]; }

  // Row-major: on a (4, 2) mesh device (i, j) has id 2*i + j.
  std::int64_t device_id(const std::vector<std::int64_t>& coords) const;
  std::vector<std::int64_t> coords(std::int64_t device_id) const;

  // The devices that communicate in a collective over `axes` (indices into axis_names(), in
  // the order given, major-to-minor): one group per coordinate of the other axes (row-major),
  // each group listing device ids by their linear index along `axes`.
  std::vector<std::vector<std::int64_t>> groups(const std::vector<int>& axes) const;

  // Product of the sizes of `axes`.
  std::int64_t group_size(const std::vector<int>& axes) const;

  bool operator==(const Mesh& other) const {
    return names_ == other.names_ && sizes_ == other.sizes_;
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::int64_t> sizes_;
  std::int64_t size_ = 1;
};

// Resolves axis names to indices, rejecting repeats: "[psum] axis 'x' appears twice in ('x', 'x')".
std::vector<int> resolve_axes(const Mesh& mesh, const std::vector<std::string>& names,
                              const std::string& op);

}  // namespace shardlab
