// Bindings for the hardware presets (shardlab/hardware.hpp); shardlab._src.core.hardware builds
// the public Hardware on top.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "shardlab/hardware.hpp"

namespace py = pybind11;
using namespace shardlab;

void init_hardware(py::module_& m) {
  py::class_<Hardware> cls(m, "Hardware", "Compute, memory and interconnect figures of one chip.");
#define SHARDLAB_HARDWARE_FIELD(type, field, kind, comment) cls.def_readonly(#field, &Hardware::field, comment);
  SHARDLAB_HARDWARE_FIELDS(SHARDLAB_HARDWARE_FIELD)
#undef SHARDLAB_HARDWARE_FIELD
  cls.def_property_readonly("nvlink_bandwidth", &Hardware::nvlink_bandwidth)
      .def("peak", &Hardware::peak, py::arg("dtype"))
      .def("has_peak", &Hardware::has_peak, py::arg("dtype"))
      .def("wraps", &Hardware::wraps, py::arg("size"))
      .def("__repr__", [](const Hardware& h) { return "<Hardware " + h.name + ">"; });
  m.def("hardware_fields", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> rows;
#define SHARDLAB_HARDWARE_FIELD(type, field, kind, comment) rows.emplace_back(#field, kind, comment);
    SHARDLAB_HARDWARE_FIELDS(SHARDLAB_HARDWARE_FIELD)
#undef SHARDLAB_HARDWARE_FIELD
    return rows;
  }, "(field, Python kind, comment) of every Hardware field, in the C++ struct's order: the one list.");
  m.def("hardware_names", &hardware_names);
  m.def("get_hardware", &get_hardware, py::arg("name"), py::return_value_policy::reference);
}

