// The _core extension: one binding file per core header (init_<header> in <header>.cpp), each
// only converting types.
#include <pybind11/pybind11.h>

#include "shardlab/buffer_pool.hpp"
#include "shardlab/fork_safety.hpp"

namespace py = pybind11;

void init_mesh(py::module_&);
void init_sharding(py::module_&);
void init_collectives(py::module_&);
void init_ledger(py::module_&);
void init_cpu_features(py::module_&);
void init_gemm(py::module_&);
void init_attention(py::module_&);
void init_cost(py::module_&);
void init_fused(py::module_&);
void init_hardware(py::module_&);
void init_ops(py::module_&);
void init_strided(py::module_&);
void init_scatter_add(py::module_&);
void init_buffer_pool(py::module_&);

PYBIND11_MODULE(_core, m) {
  m.doc() = "shardlab's C++ core: mesh, sharding, collectives, ledger, cost model and kernels.";
  shardlab::install_fork_handler();
  // "[op] needs N GiB, more than ...": Python's MemoryError with the core's text.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const shardlab::AllocationError& e) {
      py::set_error(PyExc_MemoryError, e.what());
    }
  });
  init_mesh(m);
  init_sharding(m);
  init_collectives(m);
  init_ledger(m);
  init_cpu_features(m);
  init_gemm(m);
  init_attention(m);
  init_cost(m);
  init_fused(m);
  init_hardware(m);
  init_ops(m);
  init_strided(m);
  init_scatter_add(m);
  init_buffer_pool(m);
}
