// An 8 x 8 fp32 transpose in AVX registers, shared by the GEMM packing and the attention
// tile copies.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

namespace shardlab {
// Internal linkage on purpose: each per-ISA file compiles its own copy with its own flags; an
// inline function with external linkage would be merged into one by the linker, whichever
// ISA's build it happened to keep.
namespace {

// Transposes 8 rows of 8 floats in registers (the usual unpack / shuffle / permute network).
inline void transpose8x8(__m256 v[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

}  // namespace
}  // namespace shardlab
#endif
