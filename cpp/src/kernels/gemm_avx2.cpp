// AVX2+FMA fp32 micro-kernel: a 6 x 16 tile of C in 12 ymm registers.
//
// Two FMA ports with 4-cycle latency need at least 8 independent accumulators; 12 accumulators,
// two B vectors and one broadcast fit the 16 ymm registers without spilling.
#include <immintrin.h>

#include "gemm_microkernel.hpp"

namespace shardlab::gemm_detail {
namespace {

constexpr int kMr = 6;
constexpr int kNr = 16;

// Writes the 6 x 16 accumulator tile to C (adding C's values first when accumulating).
inline void store_tile(__m256 (&acc0)[kMr], __m256 (&acc1)[kMr], float* c, int64_t ldc, bool accumulate) {
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    float* cr = c + r * ldc;
    if (accumulate) {
      acc0[r] = _mm256_add_ps(acc0[r], _mm256_loadu_ps(cr));
      acc1[r] = _mm256_add_ps(acc1[r], _mm256_loadu_ps(cr + 8));
    }
    _mm256_storeu_ps(cr, acc0[r]);
    _mm256_storeu_ps(cr + 8, acc1[r]);
  }
}

void kernel_f32(int64_t kc, const void* a_, const void* b_, float* c, int64_t ldc, bool accumulate) {
  const float* a = static_cast<const float*>(a_);
  const float* b = static_cast<const float*>(b_);
  __m256 acc0[kMr], acc1[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  // The C tile is read (accumulate) and written after the k loop; its rows lie ldc floats
  // apart and are cold. Prefetched here, they arrive during the kc FMA steps instead of
  // stalling the tail (a fifth of the kernel's time at n = 1024 before).
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNr - 1), _MM_HINT_T0);
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r);
      acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
    }
    a += kMr;
    b += kNr;
  }
  store_tile(acc0, acc1, c, ldc, accumulate);
}

// kernel_f32 with A read in place from row-major rows lda floats apart: six broadcasts per k
// from six row streams instead of one packed panel. Used when A would be packed for a single
// pass over B (N within one NC panel): packing it then costs as much per element as a pass
// over B per micro-panel, a few percent of a GEMM whose N is small.
void kernel_f32_rows_a(int64_t kc, const float* a, int64_t lda, const void* b_, float* c,
                       int64_t ldc, bool accumulate) {
  const float* b = static_cast<const float*>(b_);
  __m256 acc0[kMr], acc1[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNr - 1), _MM_HINT_T0);
  }
  const float* a0 = a;
  const float* a3 = a + 3 * lda;
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
    const float* rows[kMr] = {a0, a0 + lda, a0 + 2 * lda, a3, a3 + lda, a3 + 2 * lda};
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m256 ar = _mm256_broadcast_ss(rows[r] + k);
      acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
    }
    b += kNr;
  }
  store_tile(acc0, acc1, c, ldc, accumulate);
}

}  // namespace

}  // namespace shardlab::gemm_detail

namespace shardlab::kernels::avx2 {

using namespace gemm_detail;

KernelSet gemm_kernels(DType type) {
  KernelSet ks;
  ks.mr = kMr;
  ks.nr = kNr;
  ks.kpack = 1;
  ks.elem_bytes = 4;
  ks.mc = 6 * 20;
  ks.kc = 256;
  ks.nc = 1024;
  ks.kernel = kernel_f32;
  if (type == DType::float32) ks.kernel_rows_a = kernel_f32_rows_a;
  set_f32_packers<kMr, kNr>(ks, type);
  return ks;
}

}  // namespace shardlab::kernels::avx2
