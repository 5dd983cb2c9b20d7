// Each collective: validate and size the output, allocate it, run without the GIL, and return
// the output storage. Python prices the event from its own rule (primitives/collectives.py);
// the C++ event is for C++ callers, so it is not converted here.
#include <pybind11/stl.h>

#include "array_ref.hpp"
#include "shardlab/buffer_pool.hpp"
#include "shardlab/collectives.hpp"
#include "shardlab/ops.hpp"
#include "shardlab/scatter_add.hpp"

namespace py = pybind11;
using namespace shardlab;
using shardlab_py::as_ref;
using shardlab_py::empty_like_dtype;

namespace {

template <class Run>
py::array run(const py::array& x, const Shape& out_shape, Run&& body) {
  py::array out = empty_like_dtype(x, out_shape);
  const ArrayRef in = as_ref(x);
  const ArrayRef o = as_ref(out);
  {
    py::gil_scoped_release release;
    body(in, o);
  }
  return out;
}

}  // namespace

void init_buffer_pool(py::module_& m);

void init_collectives(py::module_& m) {
  init_buffer_pool(m);
  m.def(op_info(Op::all_gather).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, int axis, bool tiled) {
    return run(x, all_gather_shape(mesh, as_ref(x).shape, axes, axis, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) { return all_gather(mesh, in, o, axes, axis, tiled); });
  });
  m.def("all_reduce", [](const Mesh& mesh, const py::array& x, const AxisNames& axes, const std::string& op) {
    const ReduceOp r = parse_reduce_op(op);
    return run(x, all_reduce_shape(mesh, as_ref(x).shape, axes),
               [&](const ArrayRef& in, const ArrayRef& o) { return all_reduce(mesh, in, o, axes, r); });
  });
  m.def(op_info(Op::psum_scatter).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, int dim, bool tiled) {
    return run(x, psum_scatter_shape(mesh, as_ref(x).shape, axes, dim, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) { return psum_scatter(mesh, in, o, axes, dim, tiled); });
  });
  m.def(op_info(Op::all_to_all).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, int split, int concat,
                         bool tiled) {
    return run(x, all_to_all_shape(mesh, as_ref(x).shape, axes, split, concat, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) {
                 return all_to_all(mesh, in, o, axes, split, concat, tiled);
               });
  });
  m.def(op_info(Op::ppermute).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, const Perm& perm) {
    return run(x, ppermute_shape(mesh, as_ref(x).shape, axes, perm),
               [&](const ArrayRef& in, const ArrayRef& o) { return ppermute(mesh, in, o, axes, perm); });
  });
  m.def("axis_index", [](const Mesh& mesh, const AxisNames& axes) {
    const Shape shape = axis_index_shape(mesh, axes);
    py::array_t<std::int32_t> out(std::vector<py::ssize_t>(shape.begin(), shape.end()));
    axis_index(mesh, as_ref(out), axes);
    return out;
  });
  m.def(op_info(Op::broadcast).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root) {
    return run(x, broadcast_shape(mesh, as_ref(x).shape, axes, root),
               [&](const ArrayRef& in, const ArrayRef& o) { return broadcast(mesh, in, o, axes, root); });
  });
  m.def(op_info(Op::reduce).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root,
                     const std::string& op) {
    const ReduceOp r = parse_reduce_op(op);
    return run(x, reduce_shape(mesh, as_ref(x).shape, axes, root),
               [&](const ArrayRef& in, const ArrayRef& o) { return reduce(mesh, in, o, axes, root, r); });
  });
  m.def(op_info(Op::gather).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root, int axis,
                     bool tiled) {
    return run(x, gather_shape(mesh, as_ref(x).shape, axes, root, axis, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) { return gather(mesh, in, o, axes, root, axis, tiled); });
  });
  m.def(op_info(Op::scatter).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root, int dim,
                      bool tiled) {
    return run(x, scatter_shape(mesh, as_ref(x).shape, axes, root, dim, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) { return scatter(mesh, in, o, axes, root, dim, tiled); });
  });
  // Shape rules alone (no data): the primitives' shape/validation rule for every backend.
  m.def("all_gather_shape", &all_gather_shape);
  m.def("all_reduce_shape", &all_reduce_shape);
  m.def("psum_scatter_shape", &psum_scatter_shape);
  m.def("all_to_all_shape", &all_to_all_shape);
  m.def("ppermute_shape", &ppermute_shape);
  m.def("axis_index_shape", &axis_index_shape);
  m.def("broadcast_shape", &broadcast_shape);
  m.def("reduce_shape", &reduce_shape);
  m.def("gather_shape", &gather_shape);
  m.def("scatter_shape", &scatter_shape);
  // jnp.where on storages already broadcast to one shape (x, y of the result dtype).
  m.def("select", [](const py::array& cond, const py::array& x, const py::array& y) {
    const ArrayRef c = as_ref(cond), xr = as_ref(x), yr = as_ref(y);
    py::array out = empty_like_dtype(x, xr.shape);
    const ArrayRef o = as_ref(out);
    {
      py::gil_scoped_release release;
      select_strided(o, c, xr, yr);
    }
    return out;
  });
  // The gradient of a row gather: dst[p, index[p, n], :] += src[p, n, :], in place on dst.
  m.def("scatter_add_rows", [](py::array& dst, const py::array& index, const py::array& src) {
    const ArrayRef d = as_ref(dst), i = as_ref(index), s = as_ref(src);
    if (!dst.writeable()) throw std::invalid_argument("[scatter_add_rows] dst is read-only");
    py::gil_scoped_release release;
    scatter_add_rows(d, i, s);
  });
  // numpy.concatenate of views at any strides into a new pool array, on the core's threads.
  m.def("concatenate", [](const std::vector<py::array>& xs, int axis) {
    if (xs.empty()) throw std::invalid_argument("[concatenate] needs at least one array");
    std::vector<ArrayRef> refs;
    for (const auto& x : xs) refs.push_back(as_ref(x));
    if (axis < 0 || axis >= refs[0].ndim()) {
      throw std::invalid_argument("[concatenate] axis " + std::to_string(axis) + " is out of range for rank " +
                                  std::to_string(refs[0].ndim()));
    }
    Shape shape = refs[0].shape;
    shape[static_cast<std::size_t>(axis)] = 0;
    for (const auto& r : refs) shape[static_cast<std::size_t>(axis)] += r.shape[static_cast<std::size_t>(axis)];
    py::array out = empty_like_dtype(xs[0], shape);
    const ArrayRef o = as_ref(out);
    {
      py::gil_scoped_release release;
      concatenate(refs, axis, o);
    }
    return out;
  }, py::arg("arrays"), py::arg("axis"));
  // Materialize any strided view (device_put, reading a ShardedArray back) on the core's threads.
  m.def("copy", [](const py::array& x) {
    const ArrayRef in = as_ref(x);
    py::array out = empty_like_dtype(x, in.shape);
    const ArrayRef o = as_ref(out);
    {
      py::gil_scoped_release release;
      copy_strided(o, in);
    }
    return out;
  });
}

void init_buffer_pool(py::module_& m) {
  m.def("pool_cached_bytes", &pool_cached_bytes, "Bytes of freed collective outputs kept for reuse.");
  m.def("pool_capacity", &pool_capacity);
  m.def("pool_set_capacity", &pool_set_capacity, py::arg("bytes"),
        "Caps the bytes kept for reuse (0 disables caching).");
  m.def("pool_release", &pool_release, "Returns every cached buffer to the system.");
}
