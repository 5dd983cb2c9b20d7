// Bindings for the hardware presets and the collective time model; python/shardlab/hardware.py
// and python/shardlab/cost.py build the public API on top.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "shardlab/cost.hpp"
#include "shardlab/hardware.hpp"

namespace py = pybind11;
using namespace shardlab;

namespace {

void init_hardware(py::module_& m) {
  py::class_<Hardware>(m, "Hardware", "Compute, memory and interconnect figures of one chip.")
      .def_readonly("name", &Hardware::name)
      .def_readonly("family", &Hardware::family)
      .def_readonly("description", &Hardware::description)
      .def_readonly("peak_flops", &Hardware::peak_flops)
      .def_readonly("hbm_capacity", &Hardware::hbm_capacity)
      .def_readonly("hbm_bandwidth", &Hardware::hbm_bandwidth)
      .def_readonly("ici_axes", &Hardware::ici_axes)
      .def_readonly("ici_link_bandwidth", &Hardware::ici_link_bandwidth)
      .def_readonly("ici_links_per_axis", &Hardware::ici_links_per_axis)
      .def_readonly("wrap_at", &Hardware::wrap_at)
      .def_readonly("wrap_multiple", &Hardware::wrap_multiple)
      .def_readonly("hop_latency", &Hardware::hop_latency)
      .def_readonly("dcn_bandwidth", &Hardware::dcn_bandwidth)
      .def_readonly("dcn_latency", &Hardware::dcn_latency)
      .def_readonly("node_size", &Hardware::node_size)
      .def_readonly("nvlink_link_bandwidth", &Hardware::nvlink_link_bandwidth)
      .def_readonly("nvlink_links", &Hardware::nvlink_links)
      .def_readonly("ib_bandwidth", &Hardware::ib_bandwidth)
      .def_readonly("ib_latency", &Hardware::ib_latency)
      .def_property_readonly("nvlink_bandwidth", &Hardware::nvlink_bandwidth)
      .def("peak", &Hardware::peak, py::arg("dtype"))
      .def("has_peak", &Hardware::has_peak, py::arg("dtype"))
      .def("wraps", &Hardware::wraps, py::arg("size"))
      .def("__repr__", [](const Hardware& h) { return "<Hardware " + h.name + ">"; });
  m.def("hardware_names", &hardware_names);
  m.def("get_hardware", &get_hardware, py::arg("name"), py::return_value_policy::reference);
}

}  // namespace

void init_cost(py::module_& m) {
  init_hardware(m);

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
