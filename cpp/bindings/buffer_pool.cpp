// _core.pool_*: the buffer pool's cache (shardlab/buffer_pool.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "array_ref.hpp"
#include "shardlab/buffer_pool.hpp"

namespace py = pybind11;
using namespace shardlab;

void init_buffer_pool(py::module_& m) {
  m.def("pool_cached_bytes", &pool_cached_bytes, "Bytes of freed collective outputs kept for reuse.");
  m.def("pool_capacity", &pool_capacity);
  m.def("pool_set_capacity", &pool_set_capacity, py::arg("bytes"),
        "Caps the bytes kept for reuse (0 disables caching).");
  m.def("pool_release", &pool_release, "Returns every cached buffer to the system.");
  // Receive buffers for MPI collectives: a reused buffer's pages are already mapped (a fresh
  // multi-megabyte array page-faults on every call), and it returns to the pool only when numpy
  // frees the array and every view of it, so no value a user holds is ever written again.
  m.def(
      "pool_empty",
      [](const std::vector<py::ssize_t>& shape, const py::dtype& dtype) {
        return shardlab_py::pool_array(dtype, shape, "pool_empty");
      },
      py::arg("shape"), py::arg("dtype"),
      "A new uninitialized C-contiguous array from the buffer pool (its memory returns to the pool "
      "when the array and every view of it are freed).");
}
