// The inner loop of every reduction collective, one build per ISA (dispatch.hpp):
// dst[i] = op over r of src[r][i] for one row of n elements (reduce_rows_impl.hpp).
#pragma once

#include <cstdint>

#include "shardlab/dtype.hpp"
#include "shardlab/strided.hpp"

namespace shardlab::kernels {

#define SHARDLAB_DECLARE_REDUCE_ROWS(ISA)                                                                \
  namespace ISA {                                                                                        \
  void reduce_rows(DType dtype, ReduceOp op, const char* const* srcs, std::int64_t count, std::int64_t ss, \
                   char* dst, std::int64_t ds, std::int64_t n, void* scratch);                            \
  }
SHARDLAB_DECLARE_REDUCE_ROWS(scalar)
SHARDLAB_DECLARE_REDUCE_ROWS(avx2)
SHARDLAB_DECLARE_REDUCE_ROWS(avx512)
#undef SHARDLAB_DECLARE_REDUCE_ROWS
namespace avx512bf16 {
using avx512::reduce_rows;
}

}  // namespace shardlab::kernels
