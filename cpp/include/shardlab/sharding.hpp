// PartitionSpec and NamedSharding: which mesh axes split which array dimension.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "shardlab/strided.hpp"
#include "shardlab/mesh.hpp"

namespace shardlab {

// One entry per array dimension: the mesh axes that split it, major-to-minor; empty = None.
using SpecEntry = std::vector<std::string>;
using PartitionSpec = std::vector<SpecEntry>;

// A mesh axis used twice in one spec. A ValueError subclass in Python, as in JAX.
class DuplicateSpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

std::string spec_str(const PartitionSpec& spec);

class NamedSharding {
 public:
  // Throws DuplicateSpecError for a repeated axis and std::invalid_argument for an unknown one.
  NamedSharding(Mesh mesh, PartitionSpec spec);

  const Mesh& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }

  // Throws std::invalid_argument naming `op` when `global` has fewer dims than the spec has
  // entries, or a dim is not divisible by the product of the axes splitting it.
  void check_shape(const Shape& global, const std::string& op) const;
  Shape shard_shape(const Shape& global) const;
  // [start, stop) per dimension of the block `device_id` holds.
  std::vector<std::pair<std::int64_t, std::int64_t>> device_indices(std::int64_t device_id,
                                                                    const Shape& global) const;
  // Row-major index of the device among those holding the same block.
  std::int64_t replica_id(std::int64_t device_id) const;
  // Per mesh axis: does this sharding split some dimension along it?
  std::vector<bool> varying() const;
  bool is_fully_replicated() const;
  std::int64_t num_devices() const { return mesh_.size(); }
  // Product of the sizes of the axes splitting dimension `dim` (1 past the spec's end).
  std::int64_t dim_split(int dim) const;

  // The mesh-factorized storage of a global array of shape `global`: per mesh axis its size
  // where the spec names it, else 1, then the shard shape. (4, 2) mesh, P(None, 'x'), (6, 8):
  // (4, 1, 6, 2).
  Shape storage_shape(const Shape& global) const;
  // The global shape whose storage has shape `storage`; throws std::invalid_argument naming
  // `op` when `storage` is not a storage shape of this sharding.
  Shape global_shape(const Shape& storage, const std::string& op = "global_shape") const;
  // The global array `global` seen as storage: a strided view of the same memory, no copy
  // (mesh dims of the spec's axes step through the blocks, the others have size 1). Copying
  // it out is device_put; copying storage into it gathers the global array back.
  ArrayRef storage_view(const ArrayRef& global, const std::string& op = "device_put") const;

 private:
  Mesh mesh_;
  PartitionSpec spec_;
};

// Device `device_id`'s local value in mesh-factorized `storage` (mesh.ndim() leading mesh dims,
// each of size 1 or the axis size): the mesh dims fixed at the device's coordinates and
// dropped. A view of the same memory.
ArrayRef local_view(const Mesh& mesh, const ArrayRef& storage, std::int64_t device_id);

}  // namespace shardlab
