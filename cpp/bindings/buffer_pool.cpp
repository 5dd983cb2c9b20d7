// _core.pool_*: the buffer pool's cache (shardlab/buffer_pool.hpp).
#include <pybind11/pybind11.h>

#include "shardlab/buffer_pool.hpp"

namespace py = pybind11;
using namespace shardlab;

void init_buffer_pool(py::module_& m) {
  m.def("pool_cached_bytes", &pool_cached_bytes, "Bytes of freed collective outputs kept for reuse.");
  m.def("pool_capacity", &pool_capacity);
  m.def("pool_set_capacity", &pool_set_capacity, py::arg("bytes"),
        "Caps the bytes kept for reuse (0 disables caching).");
  m.def("pool_release", &pool_release, "Returns every cached buffer to the system.");
}
