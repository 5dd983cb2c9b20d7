// Batched GEMM C = A @ B on strided operands, fp32 or bf16 inputs, fp32 output.
//
// The fast path follows GotoBLAS/BLIS: A and B are packed into panels that fit the caches,
// and a register-blocked micro-kernel (one per ISA, see cpp/src/kernels/) does the FLOPs.
// The path is chosen from active_isa() at every call, so set_active_isa() takes effect at once.
#pragma once

#include <cstdint>
#include <vector>

#include "shardlab/dtype.hpp"

namespace shardlab {

// One operand: a (rows x cols) matrix at `data` with strides in ELEMENTS (not bytes), which may
// be zero or negative, so transposed and broadcast views need no copy.
struct GemmOperand {
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0;
};

// C[b] = A[b] @ B[b] for every index b of `batch_shape`. The batch strides (in elements) say
// where matrix b starts; a stride of 0 broadcasts that operand along the dimension. C has
// unit column stride and row stride `c_row_stride`.
struct GemmProblem {
  DType type = DType::float32;  // float32, or bfloat16 as uint16_t bits; gemm() checks
  GemmOperand a, b;
  float* c = nullptr;
  int64_t c_row_stride = 0;
  std::vector<int64_t> batch_shape;
  std::vector<int64_t> a_batch_strides, b_batch_strides, c_batch_strides;
};

// Runs on the active ISA path with up to omp_get_max_threads() threads. Throws
// std::invalid_argument if the shapes disagree (a.cols != b.rows, batch ranks differ).
void gemm(const GemmProblem& p);

// The naive triple loop (double accumulation) every fast path is tested against.
void gemm_reference(const GemmProblem& p);

}  // namespace shardlab
