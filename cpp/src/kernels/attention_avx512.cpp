// AVX-512 instantiation of the tiled flash attention (attention_tile.hpp): 6 x 64 micro-tiles
// (24 zmm accumulators) and a vectorized exp2.
// GCC 12 reports its own _mm512_undefined_* placeholders inside avx512fintrin.h as
// "maybe uninitialized" once the conversions are inlined; the warning is about the header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "attention_tile.hpp"

namespace shardlab::detail {
namespace {

struct VecAvx512 {
  using R = __m512;
  static constexpr int W = 16, MR = 6, NV = 4, BQ = 64, BK = 64;
  static R zero() { return _mm512_setzero_ps(); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  // 2^x = 2^n * 2^f with n = round(x), |f| <= 1/2 and a degree-5 polynomial fitted on
  // Chebyshev nodes (max relative error 2.3e-7, about 2 ulp). Clamping to -127 makes the
  // exponent field 0, so exp2(-inf) is exactly 0 (masked scores contribute nothing). MAXPS and
  // MINPS return their second operand when either is NaN, hence the operand order: a NaN
  // score must give a NaN probability, not a silently dropped key.
  static R exp2(R x) {
    x = _mm512_min_ps(set1(127.0f), _mm512_max_ps(set1(-127.0f), x));  // NaN stays NaN
    const R n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const R f = sub(x, n);
    R p = set1(1.3266970636323094e-3f);
    p = fma(p, f, set1(9.675459936261177e-3f));
    p = fma(p, f, set1(5.550742521882057e-2f));
    p = fma(p, f, set1(2.4022121727466583e-1f));
    p = fma(p, f, set1(6.931469440460205e-1f));
    p = fma(p, f, set1(1.0000001192092896f));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return mul(p, _mm512_castsi512_ps(e));
  }
};

}  // namespace

}  // namespace shardlab::detail

namespace shardlab::kernels::avx512 {

void attention_forward(const AttentionProblem& p, const void* q, const void* k, const void* v, void* out,
                       float* lse) {
  detail::forward_dispatch<detail::VecAvx512>(p, q, k, v, out, lse);
}

void attention_backward(const AttentionProblem& p, const void* q, const void* k, const void* v, const void* out,
                        const void* dout, const float* lse, float* dq, float* dk, float* dv) {
  detail::backward_dispatch<detail::VecAvx512>(p, q, k, v, out, dout, lse, dq, dk, dv);
}

}  // namespace shardlab::kernels::avx512
