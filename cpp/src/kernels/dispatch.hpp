// The one idiom for per-ISA kernel builds and the one place a build is chosen.
//
// Each kernel family declares its entry points once per ISA namespace,
// shardlab::kernels::{scalar, avx2, avx512, avx512bf16}, with the same names in every one; an
// ISA without a build of its own aliases the one below it (`namespace avx512bf16 { using
// avx512::reduce_rows; }`). The file <family>_<isa>.cpp, compiled with that ISA's flags
// (CMakeLists.txt), defines them; the build without a suffix is the scalar one. Callers take
// SHARDLAB_KERNEL(name): &kernels::<active ISA>::name, picked here from cpu_features'
// active_isa() (SHARDLAB_ISA and set_active_isa cap it, so tests run every path).
#pragma once

#include "shardlab/cpu_features.hpp"

namespace shardlab::kernels {

template <class Fn>
Fn pick(Fn scalar, Fn avx2, Fn avx512, Fn avx512bf16) {
  switch (active_isa()) {
    case Isa::avx512bf16: return avx512bf16;
    case Isa::avx512: return avx512;
    case Isa::avx2: return avx2;
    case Isa::scalar: break;
  }
  return scalar;
}

}  // namespace shardlab::kernels

#define SHARDLAB_KERNEL(NAME)                                                                     \
  ::shardlab::kernels::pick(&::shardlab::kernels::scalar::NAME, &::shardlab::kernels::avx2::NAME, \
                            &::shardlab::kernels::avx512::NAME, &::shardlab::kernels::avx512bf16::NAME)
