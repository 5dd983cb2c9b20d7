// C = A @ B on strided arrays (numpy's batched matmul rules), validated once here and run by
// the GEMM kernel: the Python binding and C++ callers share these checks and messages.
#pragma once

#include <string>

#include "shardlab/gemm.hpp"
#include "shardlab/strided.hpp"

namespace shardlab {

// Shape of a @ b: both of one rank >= 2, inner dims equal, batch dims equal or 1 (broadcast).
// Throws std::invalid_argument starting "[op]" and naming both shapes.
Shape matmul_shape(const Shape& a, const Shape& b, const std::string& op = "gemm");

// The GemmProblem computing c = a @ b without copies: a and b float32, or both bfloat16, with
// byte strides that are whole elements (zero and negative allowed); c float32 of
// matmul_shape(a, b) with unit column stride. Throws std::invalid_argument naming `op`.
GemmProblem matmul_problem(const ArrayRef& a, const ArrayRef& b, const ArrayRef& c,
                           const std::string& op = "gemm");

// gemm(matmul_problem(a, b, c)).
void matmul(const ArrayRef& a, const ArrayRef& b, const ArrayRef& c);

}  // namespace shardlab
