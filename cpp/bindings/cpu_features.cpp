#include <pybind11/pybind11.h>

#include "shardlab/cpu_features.hpp"

namespace py = pybind11;

void init_cpu_features(py::module_& m) {
  m.def("detected_isa", [] { return shardlab::isa_name(shardlab::detected_isa()); },
        "The best instruction-set path this CPU supports.");
  m.def("active_isa", [] { return shardlab::isa_name(shardlab::active_isa()); },
        "The instruction-set path the kernels use now.");
  m.def("set_active_isa",
        [](const std::string& name) { shardlab::set_active_isa(shardlab::parse_isa(name)); },
        py::arg("isa"), "Force a lower instruction-set path (scalar, avx2, avx512, avx512bf16).");
  m.def("measure_clock_ghz", &shardlab::measure_clock_ghz,
        py::call_guard<py::gil_scoped_release>(),
        "The clock of the calling core in GHz, from a dependent integer-add chain (~0.2 s).");
}
