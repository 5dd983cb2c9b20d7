// numpy <-> ArrayRef without copies, shared by the binding files.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "shardlab/buffer_pool.hpp"
#include "shardlab/strided.hpp"

namespace shardlab_py {

namespace py = pybind11;

inline shardlab::DType dtype_of(const py::array& a) {
  // The numpy type number avoids a Python attribute lookup per call (the per-collective
  // overhead budget is ~20 us); bfloat16 is a user type whose number is learned once.
  static int bf16_num = -1;
  const int num = a.dtype().num();
  switch (num) {
    case 11: return shardlab::DType::float32;   // NPY_FLOAT
    case 12: return shardlab::DType::float64;   // NPY_DOUBLE
    case 1: return shardlab::DType::int8;       // NPY_BYTE
    case 0: return shardlab::DType::bool_;      // NPY_BOOL
    default: break;
  }
  if (num == bf16_num) return shardlab::DType::bfloat16;
  if (a.dtype().kind() == 'i' && a.itemsize() == 4) return shardlab::DType::int32;
  const shardlab::DType d = shardlab::parse_dtype(py::str(a.dtype().attr("name")));
  if (d == shardlab::DType::bfloat16) bf16_num = num;
  return d;
}

// Views a numpy array. The core never writes through views of inputs.
inline shardlab::ArrayRef as_ref(const py::array& a) {
  shardlab::ArrayRef r;
  r.data = const_cast<void*>(a.data());
  r.dtype = dtype_of(a);
  r.shape.assign(a.shape(), a.shape() + a.ndim());
  r.strides.assign(a.strides(), a.strides() + a.ndim());
  return r;
}

// A new C-contiguous array from the buffer pool; the buffer returns to the pool when numpy
// frees the array.
struct PoolBlock {
  void* data;
  std::size_t bytes;
};

// `op` names the caller in the MemoryError raised when the array cannot fit in this machine's
// memory (shardlab::check_alloc, checked before anything is allocated).
inline py::array pool_array(const py::dtype& dtype, const std::vector<py::ssize_t>& shape, const char* op) {
  const std::size_t bytes = shardlab::checked_bytes(
      op, shardlab::Shape(shape.begin(), shape.end()), static_cast<std::size_t>(dtype.itemsize()),
      "its output of shape " + shardlab::shape_str(shardlab::Shape(shape.begin(), shape.end())) +
          " is that large; shard it over more devices, or use an abstract mesh (make_mesh(..., abstract=True))");
  auto* block = new PoolBlock{shardlab::pool_allocate(bytes, op), bytes};
  PyObject* cap = PyCapsule_New(block, "shardlab.pool", [](PyObject* c) {
    auto* b = static_cast<PoolBlock*>(PyCapsule_GetPointer(c, "shardlab.pool"));
    shardlab::pool_free(b->data, b->bytes);
    delete b;
  });
  if (cap == nullptr) {
    shardlab::pool_free(block->data, block->bytes);
    delete block;
    throw py::error_already_set();
  }
  auto owner = py::reinterpret_steal<py::capsule>(cap);
  return py::array(dtype, shape, block->data, owner);
}

inline py::array empty_like_dtype(const py::array& a, const shardlab::Shape& shape, const char* op) {
  return pool_array(a.dtype(), std::vector<py::ssize_t>(shape.begin(), shape.end()), op);
}

// A new numpy-owned array whose size is checked first (outputs that do not come from the pool).
inline py::array checked_array(const char* op, const py::dtype& dtype, const std::vector<py::ssize_t>& shape) {
  shardlab::checked_bytes(op, shardlab::Shape(shape.begin(), shape.end()), static_cast<std::size_t>(dtype.itemsize()));
  return py::array(dtype, shape);
}

}  // namespace shardlab_py
