// The _core extension: one init_<module> per binding file, each only converting types.
#include <pybind11/pybind11.h>

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

PYBIND11_MODULE(_core, m) {
  m.doc() = "shardlab's C++ core: mesh, sharding, collectives, ledger, cost model and kernels.";
  shardlab::install_fork_handler();
  init_mesh(m);
  init_sharding(m);
  init_collectives(m);
  init_ledger(m);
  init_cpu_features(m);
  init_gemm(m);
  init_attention(m);
  init_cost(m);
  init_fused(m);
}
