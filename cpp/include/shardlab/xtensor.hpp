// shardlab from C++ with xtensor: put an xt::xarray on an emulated mesh, run collectives and
// per-device matmuls on it, read every device's shard back as an xtensor view, print the ledger.
//
// Values live in mesh-factorized storage (see strided.hpp): one xt::xarray whose leading
// mesh.ndim() dims are the mesh axes (size 1 where the value is the same along the axis)
// followed by the local dims. Elementwise xtensor expressions on storage are per-device ops
// (the size-1 mesh dims broadcast), so a shard_map body is ordinary xtensor code between the
// Emulator's collectives.
//
//   shardlab::Emulator em(shardlab::Mesh({"x", "y"}, {4, 2}));
//   xt::xarray<float> a = xt::random::rand<float>({8, 4});
//   auto s = em.device_put(a, {{"x"}, {"y"}});       // storage (4, 2, 2, 2)
//   auto total = em.psum(s, {"x"});                   // (1, 2, 2, 2): a partial sum per y
//   auto mine = em.shard(total, 5);                   // device 5's block, no copy
//   std::cout << em.ledger().table();
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include "shardlab/collectives.hpp"
#include "shardlab/dtype.hpp"
#include "shardlab/ledger.hpp"
#include "shardlab/strided.hpp"
#include "shardlab/matmul.hpp"
#include "shardlab/mesh.hpp"
#include "shardlab/sharding.hpp"

namespace shardlab {

// An ArrayRef over the memory of an xtensor container or adaptor (xt::xarray, xt::xtensor,
// the result of xt::adapt, the views Emulator::shard returns): no copy. The core never writes
// through a view of an input, so a const container is fine.
template <class E>
ArrayRef xt_ref(const E& e) {
  using T = std::remove_const_t<typename E::value_type>;
  ArrayRef r;
  r.data = const_cast<T*>(e.data() + e.data_offset());
  r.dtype = dtype_v<T>;
  for (std::size_t d = 0; d < e.dimension(); ++d) {
    r.shape.push_back(static_cast<std::int64_t>(e.shape()[d]));
    r.strides.push_back(e.shape()[d] == 1 ? 0
                                          : static_cast<std::int64_t>(e.strides()[d]) *
                                                static_cast<std::int64_t>(sizeof(T)));
  }
  return r;
}

// An xtensor view of the memory an ArrayRef describes (xt::adapt with its strides): no copy.
// T is the element type, const for a read-only view. Throws std::invalid_argument when T does
// not match the dtype, or a stride is negative or not a whole number of elements.
template <class T>
auto xt_view(const ArrayRef& r) {
  using V = std::remove_const_t<T>;
  if (r.dtype != dtype_v<V>) {
    throw std::invalid_argument("[xt_view] the array holds " + dtype_name(r.dtype) + ", not " +
                                dtype_name(dtype_v<V>));
  }
  std::vector<std::size_t> shape;
  std::vector<std::ptrdiff_t> strides;
  for (int d = 0; d < r.ndim(); ++d) {
    const std::int64_t s = r.strides[d];
    if (s < 0 || s % static_cast<std::int64_t>(sizeof(V)) != 0) {
      throw std::invalid_argument("[xt_view] byte stride " + std::to_string(s) + " in dim " +
                                  std::to_string(d) + " is negative or not a whole element");
    }
    shape.push_back(static_cast<std::size_t>(r.shape[d]));
    strides.push_back(static_cast<std::ptrdiff_t>(r.shape[d] == 1 ? 0 : s / static_cast<std::int64_t>(sizeof(V))));
  }
  // xtensor sizes a strided adaptor's buffer by its element count (it refuses any other size),
  // whatever memory the strides span; elements are reached through the strides either way.
  const auto count = static_cast<std::size_t>(r.size());
  return xt::adapt(static_cast<T*>(r.data), count, xt::no_ownership(), std::move(shape), std::move(strides));
}

// A C-contiguous xt::xarray of `shape` (uninitialised: every caller overwrites it).
template <class T>
xt::xarray<T> xt_empty(const Shape& shape) {
  return xt::xarray<T>::from_shape(std::vector<std::size_t>(shape.begin(), shape.end()));
}

// A mesh of emulated devices and the ledger of what ran on it. Arrays are xt::xarray storage
// (see the file comment); every collective returns a new storage array and appends its Event.
class Emulator {
 public:
  explicit Emulator(Mesh mesh) : mesh_(std::move(mesh)) {}

  const Mesh& mesh() const { return mesh_; }
  Ledger& ledger() { return ledger_; }
  const Ledger& ledger() const { return ledger_; }
  NamedSharding sharding(const PartitionSpec& spec) const { return NamedSharding(mesh_, spec); }

  // device_put: the global array `global` placed with NamedSharding(mesh, spec), as storage
  // (one strided copy). Throws std::invalid_argument when a dim does not divide.
  template <class T>
  xt::xarray<T> device_put(const xt::xarray<T>& global, const PartitionSpec& spec) const {
    const ArrayRef src = sharding(spec).storage_view(xt_ref(global), "device_put");
    xt::xarray<T> out = xt_empty<T>(src.shape);
    copy_strided(xt_ref(out), src);
    return out;
  }

  // The global array whose storage under `spec` is `storage` (one strided copy).
  template <class T>
  xt::xarray<T> device_get(const xt::xarray<T>& storage, const PartitionSpec& spec) const {
    const NamedSharding s = sharding(spec);
    xt::xarray<T> out = xt_empty<T>(s.global_shape(xt_ref(storage).shape, "device_get"));
    copy_strided(s.storage_view(xt_ref(out), "device_get"), xt_ref(storage));
    return out;
  }

  // Device `device_id`'s local value: a read-only xt::adapt view into `storage`, no copy. It
  // stays valid while `storage` lives and is not resized.
  template <class T>
  auto shard(const xt::xarray<T>& storage, std::int64_t device_id) const {
    return xt_view<const T>(local_view(mesh_, xt_ref(storage), device_id));
  }

  template <class T>
  xt::xarray<T> psum(const xt::xarray<T>& x, const AxisNames& axes) { return all_reduce(x, axes, ReduceOp::sum); }
  template <class T>
  xt::xarray<T> pmean(const xt::xarray<T>& x, const AxisNames& axes) { return all_reduce(x, axes, ReduceOp::mean); }
  template <class T>
  xt::xarray<T> pmax(const xt::xarray<T>& x, const AxisNames& axes) { return all_reduce(x, axes, ReduceOp::max); }
  template <class T>
  xt::xarray<T> pmin(const xt::xarray<T>& x, const AxisNames& axes) { return all_reduce(x, axes, ReduceOp::min); }

  template <class T>
  xt::xarray<T> all_reduce(const xt::xarray<T>& x, const AxisNames& axes, ReduceOp op) {
    const ArrayRef in = xt_ref(x);
    xt::xarray<T> out = xt_empty<T>(all_reduce_shape(mesh_, in.shape, axes));
    ledger_.append(shardlab::all_reduce(mesh_, in, xt_ref(out), axes, op));
    return out;
  }

  // jax.lax.all_gather(x, axes, axis=axis, tiled=tiled).
  template <class T>
  xt::xarray<T> all_gather(const xt::xarray<T>& x, const AxisNames& axes, int axis = 0, bool tiled = false) {
    const ArrayRef in = xt_ref(x);
    xt::xarray<T> out = xt_empty<T>(all_gather_shape(mesh_, in.shape, axes, axis, tiled));
    ledger_.append(shardlab::all_gather(mesh_, in, xt_ref(out), axes, axis, tiled));
    return out;
  }

  // jax.lax.psum_scatter(x, axes, scatter_dimension=dim, tiled=tiled).
  template <class T>
  xt::xarray<T> psum_scatter(const xt::xarray<T>& x, const AxisNames& axes, int dim = 0, bool tiled = false) {
    const ArrayRef in = xt_ref(x);
    xt::xarray<T> out = xt_empty<T>(psum_scatter_shape(mesh_, in.shape, axes, dim, tiled));
    ledger_.append(shardlab::psum_scatter(mesh_, in, xt_ref(out), axes, dim, tiled));
    return out;
  }

  // jax.lax.all_to_all(x, axes, split_axis, concat_axis, tiled=tiled).
  template <class T>
  xt::xarray<T> all_to_all(const xt::xarray<T>& x, const AxisNames& axes, int split_axis, int concat_axis,
                           bool tiled = false) {
    const ArrayRef in = xt_ref(x);
    xt::xarray<T> out = xt_empty<T>(all_to_all_shape(mesh_, in.shape, axes, split_axis, concat_axis, tiled));
    ledger_.append(shardlab::all_to_all(mesh_, in, xt_ref(out), axes, split_axis, concat_axis, tiled));
    return out;
  }

  // jax.lax.ppermute(x, axes, perm): (source, destination) pairs of indices along `axes`.
  template <class T>
  xt::xarray<T> ppermute(const xt::xarray<T>& x, const AxisNames& axes, const Perm& perm) {
    const ArrayRef in = xt_ref(x);
    xt::xarray<T> out = xt_empty<T>(ppermute_shape(mesh_, in.shape, axes, perm));
    ledger_.append(shardlab::ppermute(mesh_, in, xt_ref(out), axes, perm));
    return out;
  }

  // Every device's a @ b with the GEMM kernel (float32 storage; the mesh dims broadcast as
  // batch dims), recorded as a "matmul" event with its FLOPs and bytes per device.
  xt::xarray<float> matmul(const xt::xarray<float>& a, const xt::xarray<float>& b) {
    const ArrayRef ar = xt_ref(a), br = xt_ref(b);
    xt::xarray<float> c = xt_empty<float>(matmul_shape(ar.shape, br.shape, "matmul"));
    const ArrayRef cr = xt_ref(c);
    shardlab::matmul(ar, br, cr);
    const int nd = cr.ndim();
    Event e;
    e.op = "matmul";
    e.group_size = 1;
    e.num_groups = mesh_.size();
    e.bytes_in = local_bytes(ar) + local_bytes(br);
    e.bytes_out = local_bytes(cr);
    e.flops = 2.0 * static_cast<double>(local_bytes(cr) / 4) * static_cast<double>(ar.shape[nd - 1]);
    e.hbm_bytes = static_cast<double>(e.bytes_in + e.bytes_out);
    e.algorithm = "local";
    e.bytes_sent = 0;
    ledger_.append(e);
    return c;
  }

 private:
  // Bytes of one device's local value (the dims after the mesh dims).
  std::int64_t local_bytes(const ArrayRef& storage) const {
    std::int64_t n = static_cast<std::int64_t>(itemsize(storage.dtype));
    for (int d = mesh_.ndim(); d < storage.ndim(); ++d) n *= storage.shape[d];
    return n;
  }

  Mesh mesh_;
  Ledger ledger_;
};

}  // namespace shardlab
