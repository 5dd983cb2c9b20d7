// numpy <-> ArrayRef without copies, shared by the binding files.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "shardlab/local_array.hpp"

namespace shardlab_py {

namespace py = pybind11;

inline shardlab::DType dtype_of(const py::array& a) {
  return shardlab::parse_dtype(py::str(a.dtype().attr("name")));
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

inline py::array empty_like_dtype(const py::array& a, const shardlab::Shape& shape) {
  return py::array(a.dtype(), std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

}  // namespace shardlab_py
