// Collectives on mesh-factorized storage: each one is a strided copy or reduction between
// views. `in` and `out` hold mesh.ndim() leading mesh dims (size 1 where the value is the same
// along that axis) followed by the local dims. Shapes and semantics follow jax.lax exactly;
// the *_shape functions validate the arguments and give the output storage shape, and each
// collective checks `out` against it, runs, and returns its ledger Event.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shardlab/ledger.hpp"
#include "shardlab/strided.hpp"
#include "shardlab/mesh.hpp"

namespace shardlab {

using AxisNames = std::vector<std::string>;
using Perm = std::vector<std::pair<std::int64_t, std::int64_t>>;

Shape all_gather_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, int axis, bool tiled);
Event all_gather(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                 int axis, bool tiled);

// op is psum (sum), pmax, pmin or pmean.
Shape all_reduce_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes);
Event all_reduce(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                 ReduceOp op);

Shape psum_scatter_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes,
                         int scatter_dimension, bool tiled);
Event psum_scatter(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                   int scatter_dimension, bool tiled);

Shape all_to_all_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, int split_axis,
                       int concat_axis, bool tiled);
Event all_to_all(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                 int split_axis, int concat_axis, bool tiled);

// perm: (source, destination) pairs of linear indices along `axes`; devices that receive
// nothing hold zeros.
Shape ppermute_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, const Perm& perm);
Event ppermute(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
               const Perm& perm);

// int32 storage holding each device's linear index along `axes`.
Shape axis_index_shape(const Mesh& mesh, const AxisNames& axes);
void axis_index(const Mesh& mesh, const ArrayRef& out, const AxisNames& axes);

// MPI-style rooted collectives (root = linear index along `axes`). Non-root devices of
// reduce and gather hold zeros, as with ppermute's devices that receive nothing.
Shape broadcast_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root);
Event broadcast(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
                std::int64_t root);
Shape reduce_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root);
Event reduce(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
             std::int64_t root, ReduceOp op);
Shape gather_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root,
                   int axis, bool tiled);
Event gather(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
             std::int64_t root, int axis, bool tiled);
Shape scatter_shape(const Mesh& mesh, const Shape& in, const AxisNames& axes, std::int64_t root,
                    int scatter_dimension, bool tiled);
Event scatter(const Mesh& mesh, const ArrayRef& in, const ArrayRef& out, const AxisNames& axes,
              std::int64_t root, int scatter_dimension, bool tiled);

}  // namespace shardlab
