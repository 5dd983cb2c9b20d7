// The core's one table of collective ops (shardlab/ops.hpp).
#include <pybind11/stl.h>

#include "shardlab/ops.hpp"

namespace py = pybind11;

void init_ops(py::module_& m) {
  m.def("op_table", [] {
    py::list out;
    for (const auto& info : shardlab::op_table()) {
      out.append(py::make_tuple(info.name, shardlab::collective_name(info.collective)));
    }
    return out;
  }, "(op name, the book's collective name) for every collective op, the core's one list.");
}
