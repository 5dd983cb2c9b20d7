// Strided views of memory (ArrayRef) and the copies, selects and reductions between them.
// Mesh-factorized local storage is one such view whose leading mesh.ndim dims are the mesh
// axes (size 1 where the value is the same along that axis) followed by the local dims;
// collectives are strided copies and strided reductions between views of such arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardlab/dtype.hpp"

namespace shardlab {

using Shape = std::vector<std::int64_t>;

// "(2, 3)" / "(4,)": shapes in error messages, written as Python writes tuples.
std::string shape_str(const Shape& shape);

// A view of memory: element (i_0, ..., i_{n-1}) lives at data + sum_k i_k * strides[k] bytes.
// Strides may be zero (broadcast) or negative. The view never owns the memory.
struct ArrayRef {
  void* data = nullptr;
  DType dtype = DType::float32;
  Shape shape;
  Shape strides;  // in bytes

  std::int64_t size() const;
  int ndim() const { return static_cast<int>(shape.size()); }
  std::int64_t nbytes() const { return size() * static_cast<std::int64_t>(itemsize(dtype)); }
};

// Row-major (C-order) strides in bytes for `shape`.
Shape contiguous_strides(const Shape& shape, DType dtype);
ArrayRef contiguous_ref(void* data, DType dtype, const Shape& shape);

// The storage shape of a value that varies along the mesh axes flagged in `varying`.
Shape storage_shape(const Shape& mesh_shape, const std::vector<bool>& varying, const Shape& local);

// dst = src elementwise; both views have the same shape and dtype. Parallel for large copies.
void copy_strided(const ArrayRef& dst, const ArrayRef& src);

// dst = the srcs side by side along `axis` (numpy.concatenate): every src has dst's shape
// except along `axis`, where their sizes add up to dst's. Any strides (zero to broadcast).
void concatenate(const std::vector<ArrayRef>& srcs, int axis, const ArrayRef& dst);

// dst = 0 for every element of the view.
void fill_zero(const ArrayRef& dst);

// dst = cond ? x : y elementwise; all four views have dst's shape (broadcast with zero
// strides), cond is bool and x, y have dst's dtype. Branchless, so a random mask costs the
// same as a uniform one (numpy's where branches per element).
void select_strided(const ArrayRef& dst, const ArrayRef& cond, const ArrayRef& x, const ArrayRef& y);

enum class ReduceOp { sum, max, min, mean };

// dst[i...] = op over r... of src[i..., r...]: src has dst's dims followed by `reduce_dims`
// reduction dims. bfloat16 accumulates in float32 and rounds once; int8 accumulates in int32
// and wraps on the way out, like XLA; mean divides the sum by the reduction size.
void reduce_strided(const ArrayRef& dst, const ArrayRef& src, int reduce_dims, ReduceOp op);

}  // namespace shardlab
