// AVX2+FMA instantiation of the tiled flash attention (attention_tile.hpp): 6 x 16
// micro-tiles (12 ymm accumulators, 16 registers in all) and a vectorized exp2. Tiles of 144
// queries by 144 keys (multiples of the 6-row micro-tile and of 16): against 96 x 96 the
// forward and backward at B=1 H=8 T=2048 D=128 were 1-2% faster on Zen 3 (fewer rescales of O
// and fewer passes over dQ per FLOP), the other shapes of docs/benchmarks.md as fast or faster.
#include <immintrin.h>

#include "attention_tile.hpp"

namespace shardlab::detail {
namespace {

struct VecAvx2 {
  using R = __m256;
  static constexpr int W = 8, MR = 6, NV = 2, BQ = 144, BK = 144;
  static R zero() { return _mm256_setzero_ps(); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  // Same polynomial and clamping as the AVX-512 file (max relative error 2.3e-7). Rounding by
  // the 1.5 * 2^23 shift: x + (1.5 * 2^23 + 127) rounds x to the nearest integer n (ties to
  // even, as ROUNDPS) and leaves n + 127 in the low mantissa bits, which one shift moves into
  // the exponent field; two adds replace ROUNDPS, CVTPS2DQ and the integer bias add.
  static R exp2(R x) {
    x = _mm256_min_ps(set1(127.0f), _mm256_max_ps(set1(-127.0f), x));  // NaN stays NaN
    const R shift = set1(12582912.0f + 127.0f);
    const R t = add(x, shift);
    const R f = sub(x, sub(t, shift));
    R p = set1(1.3266970636323094e-3f);
    p = fma(p, f, set1(9.675459936261177e-3f));
    p = fma(p, f, set1(5.550742521882057e-2f));
    p = fma(p, f, set1(2.4022121727466583e-1f));
    p = fma(p, f, set1(6.931469440460205e-1f));
    p = fma(p, f, set1(1.0000001192092896f));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return mul(p, _mm256_castsi256_ps(e));
  }
};

}  // namespace

}  // namespace shardlab::detail

namespace shardlab::kernels::avx2 {

void attention_forward(const AttentionProblem& p, const void* q, const void* k, const void* v, void* out,
                       float* lse) {
  detail::forward_dispatch<detail::VecAvx2>(p, q, k, v, out, lse);
}

void attention_backward(const AttentionProblem& p, const void* q, const void* k, const void* v, const void* out,
                        const void* dout, const float* lse, float* dq, float* dk, float* dv) {
  detail::backward_dispatch<detail::VecAvx2>(p, q, k, v, out, dout, lse, dq, dk, dv);
}

}  // namespace shardlab::kernels::avx2
