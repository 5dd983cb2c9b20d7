// Each collective: validate and size the output, allocate it, run without the GIL, and return
// the output storage. Python prices the event from its own rule (primitives/collectives.py);
// the C++ event is for C++ callers, so it is not converted here.
#include <pybind11/stl.h>

#include "array_ref.hpp"
#include "shardlab/collectives.hpp"
#include "shardlab/ops.hpp"

namespace py = pybind11;
using namespace shardlab;
using shardlab_py::as_ref;
using shardlab_py::empty_like_dtype;

namespace {

template <class Run>
py::array run(const char* op, const py::array& x, const Shape& out_shape, Run&& body) {
  py::array out = empty_like_dtype(x, out_shape, op);
  const ArrayRef in = as_ref(x);
  const ArrayRef o = as_ref(out);
  {
    py::gil_scoped_release release;
    body(in, o);
  }
  return out;
}

}  // namespace

void init_collectives(py::module_& m) {
  m.def(op_info(Op::all_gather).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, int axis, bool tiled) {
    return run(op_info(Op::all_gather).name, x, all_gather_shape(mesh, as_ref(x).shape, axes, axis, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) { return all_gather(mesh, in, o, axes, axis, tiled); });
  });
  m.def("all_reduce", [](const Mesh& mesh, const py::array& x, const AxisNames& axes, const std::string& op) {
    const ReduceOp r = parse_reduce_op(op);
    return run("all_reduce", x, all_reduce_shape(mesh, as_ref(x).shape, axes),
               [&](const ArrayRef& in, const ArrayRef& o) { return all_reduce(mesh, in, o, axes, r); });
  });
  m.def(op_info(Op::psum_scatter).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, int dim, bool tiled) {
    return run(op_info(Op::psum_scatter).name, x, psum_scatter_shape(mesh, as_ref(x).shape, axes, dim, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) { return psum_scatter(mesh, in, o, axes, dim, tiled); });
  });
  m.def(op_info(Op::all_to_all).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, int split, int concat,
                         bool tiled) {
    return run(op_info(Op::all_to_all).name, x, all_to_all_shape(mesh, as_ref(x).shape, axes, split, concat, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) {
                 return all_to_all(mesh, in, o, axes, split, concat, tiled);
               });
  });
  m.def(op_info(Op::ppermute).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, const Perm& perm) {
    return run(op_info(Op::ppermute).name, x, ppermute_shape(mesh, as_ref(x).shape, axes, perm),
               [&](const ArrayRef& in, const ArrayRef& o) { return ppermute(mesh, in, o, axes, perm); });
  });
  m.def("axis_index", [](const Mesh& mesh, const AxisNames& axes) {
    const Shape shape = axis_index_shape(mesh, axes);
    py::array out = shardlab_py::checked_array("axis_index", py::dtype::of<std::int32_t>(),
                                               std::vector<py::ssize_t>(shape.begin(), shape.end()));
    axis_index(mesh, as_ref(out), axes);
    return out;
  });
  m.def(op_info(Op::broadcast).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root) {
    return run(op_info(Op::broadcast).name, x, broadcast_shape(mesh, as_ref(x).shape, axes, root),
               [&](const ArrayRef& in, const ArrayRef& o) { return broadcast(mesh, in, o, axes, root); });
  });
  m.def(op_info(Op::reduce).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root,
                     const std::string& op) {
    const ReduceOp r = parse_reduce_op(op);
    return run(op_info(Op::reduce).name, x, reduce_shape(mesh, as_ref(x).shape, axes, root),
               [&](const ArrayRef& in, const ArrayRef& o) { return reduce(mesh, in, o, axes, root, r); });
  });
  m.def(op_info(Op::gather).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root, int axis,
                     bool tiled) {
    return run(op_info(Op::gather).name, x, gather_shape(mesh, as_ref(x).shape, axes, root, axis, tiled),
               [&](const ArrayRef& in, const ArrayRef& o) { return gather(mesh, in, o, axes, root, axis, tiled); });
  });
  m.def(op_info(Op::scatter).name, [](const Mesh& mesh, const py::array& x, const AxisNames& axes, std::int64_t root, int dim,
                      bool tiled) {
    return run(op_info(Op::scatter).name, x, scatter_shape(mesh, as_ref(x).shape, axes, root, dim, tiled),
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
}
