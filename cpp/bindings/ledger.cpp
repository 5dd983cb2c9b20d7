#include <pybind11/stl.h>

#include "shardlab/ledger.hpp"

namespace py = pybind11;

void init_ledger_class(py::module_& m);

void init_ledger(py::module_& m) {
  using shardlab::Event;
  py::class_<Event>(m, "Event")
      .def(py::init<>())
      .def_readwrite("op", &Event::op)
      .def_readwrite("axes", &Event::axes)
      .def_readwrite("group_size", &Event::group_size)
      .def_readwrite("num_groups", &Event::num_groups)
      .def_property("dtype", [](const Event& e) { return shardlab::dtype_name(e.dtype); },
                    [](Event& e, const std::string& s) { e.dtype = shardlab::parse_dtype(s); })
      .def_readwrite("bytes_in", &Event::bytes_in)
      .def_readwrite("bytes_out", &Event::bytes_out)
      .def_readwrite("bytes_sent", &Event::bytes_sent)
      .def_readwrite("algorithm", &Event::algorithm)
      .def_readwrite("flops", &Event::flops)
      .def_readwrite("hbm_bytes", &Event::hbm_bytes)
      .def_readwrite("seconds", &Event::seconds);
  m.def("ring_bytes_sent", &shardlab::ring_bytes_sent, py::arg("op"), py::arg("n"), py::arg("full_bytes"));
  m.def("bus_bandwidth_factor", &shardlab::bus_bandwidth_factor, py::arg("op"), py::arg("n"));
  init_ledger_class(m);
}

void init_ledger_class(py::module_& m) {
  using shardlab::Ledger;
  py::class_<Ledger>(m, "Ledger")
      .def(py::init<>())
      .def("append", &Ledger::append, py::arg("event"))
      .def("events", &Ledger::events)
      .def("clear", &Ledger::clear)
      .def("__len__", &Ledger::size)
      .def("total_bytes_sent", &Ledger::total_bytes_sent)
      .def("bytes_sent_by_op", &Ledger::bytes_sent_by_op)
      .def("bytes_sent_by_axes", &Ledger::bytes_sent_by_axes)
      .def("table", &Ledger::table);
}
