#include <pybind11/stl.h>

#include "shardlab/sharding.hpp"

namespace py = pybind11;

void init_sharding(py::module_& m) {
  using shardlab::NamedSharding;
  static py::exception<shardlab::DuplicateSpecError> dup(m, "DuplicateSpecError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const shardlab::DuplicateSpecError& e) {
      py::set_error(dup, e.what());
    }
  });
  py::class_<NamedSharding>(m, "NamedSharding")
      .def(py::init<shardlab::Mesh, shardlab::PartitionSpec>(), py::arg("mesh"), py::arg("spec"))
      .def("check_shape", &NamedSharding::check_shape, py::arg("shape"), py::arg("op"))
      .def("shard_shape", &NamedSharding::shard_shape, py::arg("shape"))
      .def("device_indices", &NamedSharding::device_indices, py::arg("device_id"), py::arg("shape"))
      .def("replica_id", &NamedSharding::replica_id, py::arg("device_id"))
      .def("varying", &NamedSharding::varying)
      .def("dim_split", &NamedSharding::dim_split, py::arg("dim"))
      .def_property_readonly("is_fully_replicated", &NamedSharding::is_fully_replicated);
  m.def("spec_str", &shardlab::spec_str, py::arg("spec"));
}
