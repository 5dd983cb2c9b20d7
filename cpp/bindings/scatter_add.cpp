// _core.scatter_add_rows: shardlab/scatter_add.hpp in place on a writable numpy array.
#include <pybind11/pybind11.h>

#include "array_ref.hpp"
#include "shardlab/scatter_add.hpp"

namespace py = pybind11;
using namespace shardlab;
using shardlab_py::as_ref;

void init_scatter_add(py::module_& m) {
  // The gradient of a row gather: dst[p, index[p, n], :] += src[p, n, :], in place on dst.
  m.def("scatter_add_rows", [](py::array& dst, const py::array& index, const py::array& src) {
    const ArrayRef d = as_ref(dst), i = as_ref(index), s = as_ref(src);
    if (!dst.writeable()) throw std::invalid_argument("[scatter_add_rows] dst is read-only");
    py::gil_scoped_release release;
    scatter_add_rows(d, i, s);
  });
}
