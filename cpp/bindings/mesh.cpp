#include <pybind11/stl.h>

#include "shardlab/mesh.hpp"

namespace py = pybind11;

void init_mesh(py::module_& m) {
  using shardlab::Mesh;
  py::class_<Mesh>(m, "Mesh", "Named mesh axes with row-major device ids.")
      .def(py::init<std::vector<std::string>, std::vector<std::int64_t>>(), py::arg("axis_names"),
           py::arg("axis_sizes"))
      .def_property_readonly("axis_names", &Mesh::axis_names)
      .def_property_readonly("axis_sizes", &Mesh::axis_sizes)
      .def_property_readonly("size", &Mesh::size)
      .def_property_readonly("ndim", &Mesh::ndim)
      .def("device_id", &Mesh::device_id, py::arg("coords"))
      .def("coords", &Mesh::coords, py::arg("device_id"))
      .def("groups",
           [](const Mesh& mesh, const std::vector<std::string>& axes) {
             return mesh.groups(shardlab::resolve_axes(mesh, axes, "groups"));
           },
           py::arg("axes"), "Device ids of each group communicating over `axes` (major-to-minor).")
      .def("__eq__", &Mesh::operator==);
}
