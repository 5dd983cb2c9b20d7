// Bindings for the collective time model (shardlab/cost.hpp); shardlab._src.cost builds the
// public API on top.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "shardlab/cost.hpp"

namespace py = pybind11;
using namespace shardlab;


void init_cost(py::module_& m) {
  py::class_<LinkCount>(m, "LinkCount")
      .def_readonly("src", &LinkCount::src)
      .def_readonly("dst", &LinkCount::dst)
      .def_readonly("bytes", &LinkCount::bytes)
      .def("__repr__", [](const LinkCount& l) {
        return "<LinkCount " + std::to_string(l.src) + "->" +
               (l.dst < 0 ? std::string("switch") : std::to_string(l.dst)) + ": " +
               std::to_string(l.bytes) + " bytes>";
      });

  py::class_<AxisSchedule>(m, "AxisSchedule")
      .def_property_readonly("op", [](const AxisSchedule& s) { return collective_name(s.op); })
      .def_readonly("size", &AxisSchedule::size)
      .def_property_readonly("topology",
                             [](const AxisSchedule& s) { return topology_name(s.topology); })
      .def_readonly("bytes", &AxisSchedule::bytes)
      .def_readonly("steps", &AxisSchedule::steps)
      .def_readonly("step_max_bytes", &AxisSchedule::step_max_bytes)
      .def_readonly("links", &AxisSchedule::links)
      .def_readonly("max_link_bytes", &AxisSchedule::max_link_bytes)
      .def_readonly("total_link_bytes", &AxisSchedule::total_link_bytes);

  py::class_<CollectiveTime>(m, "CollectiveTime")
      .def_readonly("seconds", &CollectiveTime::seconds)
      .def_readonly("bandwidth_seconds", &CollectiveTime::bandwidth_seconds)
      .def_readonly("latency_seconds", &CollectiveTime::latency_seconds)
      .def_readonly("hops", &CollectiveTime::hops)
      .def_readonly("axis_link_bytes", &CollectiveTime::axis_link_bytes)
      .def_readonly("plan", &CollectiveTime::plan);

  py::class_<BookTime>(m, "BookTime")
      .def_readonly("available", &BookTime::available)
      .def_readonly("seconds", &BookTime::seconds)
      .def_readonly("bandwidth_seconds", &BookTime::bandwidth_seconds)
      .def_readonly("latency_seconds", &BookTime::latency_seconds);

  // Axes cross the boundary as (size, topology, one-way link bandwidth, hop latency, label).
  using AxisTuple = std::tuple<std::int64_t, std::string, double, double, std::string>;
  auto to_axes = [](const std::vector<AxisTuple>& in) {
    std::vector<AxisLinks> out;
    for (const auto& [n, topo, bw, lat, label] : in)
      out.push_back(AxisLinks{n, parse_topology(topo), bw, lat, label});
    return out;
  };
  using Perm = std::vector<std::pair<std::int64_t, std::int64_t>>;

  m.def(
      "schedule_axis",
      [](const std::string& op, std::int64_t size, const std::string& topology, double bytes,
         const Perm& perm, std::int64_t root) {
        return schedule_axis(parse_collective(op), size, parse_topology(topology), bytes, perm,
                             root);
      },
      py::arg("op"), py::arg("size"), py::arg("topology"), py::arg("bytes"),
      py::arg("perm") = Perm{}, py::arg("root") = 0);
  m.def(
      "collective_time",
      [to_axes](const std::string& op, double bytes, const std::vector<AxisTuple>& axes,
                const Perm& perm) {
        return collective_time(parse_collective(op), bytes, to_axes(axes), perm);
      },
      py::arg("op"), py::arg("bytes"), py::arg("axes"), py::arg("perm") = Perm{});
  m.def(
      "book_collective_time",
      [to_axes](const std::string& op, double bytes, const std::vector<AxisTuple>& axes) {
        return book_collective_time(parse_collective(op), bytes, to_axes(axes));
      },
      py::arg("op"), py::arg("bytes"), py::arg("axes"));
}
