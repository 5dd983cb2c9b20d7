// The loops of the fused elementwise kernels (shardlab/fused.hpp), one build per ISA
// (dispatch.hpp; defined in fused_rows_impl.hpp).
#pragma once

#include <cstdint>

#include "shardlab/fused.hpp"

namespace shardlab::kernels {

#define SHARDLAB_DECLARE_FUSED(NS)                                                                    \
  namespace NS {                                                                         \
  void silu_forward(const float*, float*, std::int64_t);                                               \
  void silu_backward(const float*, const float*, float*, std::int64_t);                                \
  void swiglu_forward(const float*, const float*, float*, std::int64_t);                               \
  void swiglu_backward(const float*, const float*, const float*, float*, float*, std::int64_t);        \
  float exp_sum_row(const float*, float, std::int64_t);                                                \
  void exp_scale_row(const float*, float, float, float*, std::int64_t);                                \
  void adamw_update(const AdamWStep&, const float*, const float*, const float*, const float*, float*, \
                    float*, float*, std::int64_t);                                                     \
  float rms_norm_row(const float*, const float*, float, float*, std::int64_t);                         \
  void rms_norm_backward_row(const float*, const float*, float, const float*, float*, float*,          \
                             std::int64_t);                                                            \
  void rotary_row(const float*, const float*, const float*, float*, std::int64_t, std::int64_t);      \
  }
SHARDLAB_DECLARE_FUSED(scalar)
SHARDLAB_DECLARE_FUSED(avx2)
SHARDLAB_DECLARE_FUSED(avx512)
#undef SHARDLAB_DECLARE_FUSED
namespace avx512bf16 {
using avx512::silu_forward;
using avx512::silu_backward;
using avx512::swiglu_forward;
using avx512::swiglu_backward;
using avx512::exp_sum_row;
using avx512::exp_scale_row;
using avx512::adamw_update;
using avx512::rms_norm_row;
using avx512::rms_norm_backward_row;
using avx512::rotary_row;
}  // namespace avx512bf16

}  // namespace shardlab::kernels
