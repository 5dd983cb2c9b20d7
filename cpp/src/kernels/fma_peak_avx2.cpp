// The register-only FMA loop behind measure_fma_peak_gflops (cpu_features.hpp): each thread
// runs independent chains of 256-bit vfmadd231ps that touch no memory, so the figure is the
// FMA throughput the AVX2 kernels can hope for on this machine, clock and sharing included.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

// AVX2 only (the peak it measures is the AVX2 path's): kernels::avx2, no other builds (dispatch.hpp).
namespace shardlab::kernels::avx2 {

double fma_peak_gflops(int threads, int64_t iters) {
  // 12 accumulators: two FMA pipes x 4-cycle latency need 8 in flight; 12 leaves margin for
  // cores with longer latency or a third pipe, and with the two operands fits 16 ymm registers.
  constexpr int kChains = 12;
  float sink = 0.0f;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  {
    __m256 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + 1e-3f * c);
    // x * 1 + 0 keeps every value fixed: no denormals, no overflow, however long it runs.
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 zero = _mm256_setzero_ps();
    __asm__ volatile("" : "+x"(zero));  // the compiler must not fold x * 1 + 0 away
    for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], one, zero);
    }
    __m256 s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
    sink += _mm256_cvtss_f32(s);
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float keep = sink;  // the loops have a visible result
  (void)keep;
  const double flops = 2.0 * 8 * kChains * static_cast<double>(iters) * threads;
  return flops / secs / 1e9;
}

}  // namespace shardlab::kernels::avx2
