// Row scatter-add: the gradient of a row gather (an embedding lookup, jnp.take along an axis).
#pragma once

#include "shardlab/strided.hpp"

namespace shardlab {

// dst[p, index[p, n], c] += src[p, n, c] for every p, n, c.
// dst is [P, R, C] and contiguous; index is [P, N] (int32, any strides); src is
// [P, N, C] of dst's dtype (float32 or float64, any strides). Repeated indices accumulate in
// the order of n, so the result is deterministic; rows are split among threads by destination,
// never two threads on one row. Throws std::out_of_range naming the index if one is not in
// [0, R), before anything is written.
void scatter_add_rows(const ArrayRef& dst, const ArrayRef& index, const ArrayRef& src);

// The definition, one element at a time: the reference the tests hold the kernel to.
void scatter_add_rows_reference(const ArrayRef& dst, const ArrayRef& index, const ArrayRef& src);

}  // namespace shardlab
