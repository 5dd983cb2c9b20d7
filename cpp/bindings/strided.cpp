// _core.select, concatenate and copy: the strided copies of shardlab/strided.hpp on numpy
// arrays, into new arrays from the buffer pool, without the GIL.
#include <pybind11/stl.h>

#include "array_ref.hpp"
#include "shardlab/strided.hpp"

namespace py = pybind11;
using namespace shardlab;
using shardlab_py::as_ref;
using shardlab_py::empty_like_dtype;

void init_strided(py::module_& m) {
  // jnp.where on storages already broadcast to one shape (x, y of the result dtype).
  m.def("select", [](const py::array& cond, const py::array& x, const py::array& y) {
    const ArrayRef c = as_ref(cond), xr = as_ref(x), yr = as_ref(y);
    py::array out = empty_like_dtype(x, xr.shape, "select");
    const ArrayRef o = as_ref(out);
    {
      py::gil_scoped_release release;
      select_strided(o, c, xr, yr);
    }
    return out;
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
    py::array out = empty_like_dtype(xs[0], shape, "concatenate");
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
    py::array out = empty_like_dtype(x, in.shape, "copy");
    const ArrayRef o = as_ref(out);
    {
      py::gil_scoped_release release;
      copy_strided(o, in);
    }
    return out;
  });
}
