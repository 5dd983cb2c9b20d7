#include "shardlab/matmul.hpp"

#include <stdexcept>

namespace shardlab {
namespace {

// Element strides of `x`; byte strides that are not whole elements cannot be packed.
std::vector<std::int64_t> elem_strides(const ArrayRef& x, const char* name, const std::string& op) {
  const auto item = static_cast<std::int64_t>(itemsize(x.dtype));
  std::vector<std::int64_t> out;
  for (int d = 0; d < x.ndim(); ++d) {
    if (x.strides[d] % item != 0) {
      throw std::invalid_argument("[" + op + "] " + name + " has byte stride " +
                                  std::to_string(x.strides[d]) + " in dim " + std::to_string(d) +
                                  ", not a multiple of its item size; pass a contiguous copy of " +
                                  name);
    }
    out.push_back(x.strides[d] / item);
  }
  return out;
}

DType gemm_type(DType dtype, const char* name, const std::string& op) {
  if (dtype == DType::float32 || dtype == DType::bfloat16) return dtype;
  throw std::invalid_argument("[" + op + "] " + name + " has dtype " + dtype_name(dtype) +
                              "; the kernel takes float32 or bfloat16");
}

}  // namespace

Shape matmul_shape(const Shape& a, const Shape& b, const std::string& op) {
  const std::size_t nd = a.size();
  if (nd < 2 || b.size() != nd) {
    throw std::invalid_argument("[" + op + "] a has shape " + shape_str(a) + " and b " + shape_str(b) +
                                ": both need the same rank, at least 2 (shardlab.kernels.gemm "
                                "handles 1-D operands and rank differences)");
  }
  if (b[nd - 2] != a[nd - 1]) {
    throw std::invalid_argument("[" + op + "] a has shape " + shape_str(a) + " and b " + shape_str(b) +
                                ": inner dimensions " + std::to_string(a[nd - 1]) + " and " +
                                std::to_string(b[nd - 2]) + " differ");
  }
  Shape out;
  for (std::size_t d = 0; d + 2 < nd; ++d) {
    if (a[d] != b[d] && a[d] != 1 && b[d] != 1) {
      throw std::invalid_argument("[" + op + "] batch dims of a " + shape_str(a) + " and b " +
                                  shape_str(b) + " do not broadcast: dim " + std::to_string(d) +
                                  " is " + std::to_string(a[d]) + " vs " + std::to_string(b[d]));
    }
    out.push_back(a[d] == 1 ? b[d] : a[d]);
  }
  out.push_back(a[nd - 2]);
  out.push_back(b[nd - 1]);
  return out;
}

GemmProblem matmul_problem(const ArrayRef& a, const ArrayRef& b, const ArrayRef& c, const std::string& op) {
  const DType type = gemm_type(a.dtype, "a", op);
  if (b.dtype != a.dtype) {
    throw std::invalid_argument("[" + op + "] a has dtype " + dtype_name(a.dtype) + " and b " +
                                dtype_name(b.dtype) + "; cast both to the same dtype");
  }
  const Shape want = matmul_shape(a.shape, b.shape, op);
  if (c.dtype != DType::float32 || c.shape != want) {
    throw std::invalid_argument("[" + op + "] the result must be float32 of shape " + shape_str(want) +
                                ", got " + dtype_name(c.dtype) + " " + shape_str(c.shape));
  }
  const auto as = elem_strides(a, "a", op), bs = elem_strides(b, "b", op), cs = elem_strides(c, "c", op);
  const int nd = a.ndim();
  if (cs[nd - 1] != 1 && c.shape[nd - 1] > 1) {
    throw std::invalid_argument("[" + op + "] the result needs unit column stride, got " +
                                std::to_string(cs[nd - 1]) + " elements");
  }
  const std::int64_t m = a.shape[nd - 2], k = a.shape[nd - 1], n = b.shape[nd - 1];
  GemmProblem p;
  p.type = type;
  p.a = {a.data, m, k, as[nd - 2], as[nd - 1]};
  p.b = {b.data, k, n, bs[nd - 2], bs[nd - 1]};
  p.c = static_cast<float*>(c.data);
  p.c_row_stride = cs[nd - 2];
  for (int d = 0; d + 2 < nd; ++d) {
    p.batch_shape.push_back(want[d]);
    p.a_batch_strides.push_back(a.shape[d] == 1 ? 0 : as[d]);
    p.b_batch_strides.push_back(b.shape[d] == 1 ? 0 : bs[d]);
    p.c_batch_strides.push_back(cs[d]);
  }
  return p;
}

void matmul(const ArrayRef& a, const ArrayRef& b, const ArrayRef& c) { gemm(matmul_problem(a, b, c)); }

}  // namespace shardlab
