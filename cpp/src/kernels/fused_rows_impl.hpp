// The loops of the fused elementwise kernels (shardlab/fused.hpp), compiled once per ISA:
// fused_rows.cpp, fused_rows_avx2.cpp and fused_rows_avx512.cpp define SHARDLAB_ISA_NS and
// include this file (dispatch.hpp). Plain C++ the compiler vectorizes: the exponential is a branch-free
// polynomial (no libm call), selects instead of branches.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fused_rows.hpp"
#include "shardlab/fused.hpp"

namespace shardlab::kernels::SHARDLAB_ISA_NS {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Cody-Waite reduction xc = n ln2 + r with ln2 split in two (so r keeps its precision for
// large |xc|), |r| <= ln2/2, and exp(r) by Cephes' expf polynomial. Adding 1.5 * 2^23 + 127
// rounds xc log2(e) to the integer n and leaves n + 127 in the low mantissa bits of `bits`
// (no float-to-int conversion, which NaN would make undefined). Returns exp(r).
inline float exp_reduced(float xc, std::uint32_t& bits) {
  const float shift = 12582912.0f + 127.0f;
  const float t = xc * kLog2e + shift;
  const float n = t - shift;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  std::memcpy(&bits, &t, sizeof bits);
  return p * r * r + r + 1.0f;
}

inline float from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) for x <= 0, within 2 ulp of the true value for x >= -87.3; exactly 0 below (where
// exp(x) is under the smallest normal float); NaN stays NaN. 2^n (n + 127 in 1..127) is one
// unsigned shift of the reduction's bits into the exponent field.
inline float exp_nonpositive(float x) {
  std::uint32_t bits;
  const float p = exp_reduced(x < -87.3f ? -87.3f : x, bits);
  return x < -87.3f ? 0.0f : p * from_bits(bits << 23);
}

// exp(x) over the whole float range: 0 below -87.3, +inf above 88.72 (over the largest float),
// NaN stays NaN; within 2 ulp between. 2^n, n up to 128, is the product of two powers of two,
// each with an exponent field inside its range.
inline float exp_float(float x) {
  const float lo = x < -87.3f ? -87.3f : x;
  std::uint32_t bits;
  const float p = exp_reduced(lo > 88.72f ? 88.72f : lo, bits);
  // e = n + 127 in 1..255; 2^n = 2^(a - 127) 2^(b - 127) with a + b = e + 127.
  const std::uint32_t e = bits & 0x1FFu, a = (e + 127u) >> 1, b = e + 127u - a;
  const float y = p * from_bits(a << 23) * from_bits(b << 23);
  return x < -87.3f ? 0.0f : (x > 88.7228f ? std::numeric_limits<float>::infinity() : y);
}

// sigmoid(x) from e = exp(-|x|) <= 1, so nothing overflows: 1/(1+e) or e/(1+e).
inline float sigmoid(float x) {
  const float e = exp_nonpositive(-std::fabs(x));
  const float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}

}  // namespace

void silu_forward(const float* __restrict x, float* __restrict y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(x[i]);
}

void silu_backward(const float* __restrict x, const float* __restrict dy, float* __restrict dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(x[i]);
    dx[i] = dy[i] * (s * (1.0f + x[i] * (1.0f - s)));
  }
}

void swiglu_forward(const float* __restrict g, const float* __restrict u, float* __restrict z, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) z[i] = g[i] * sigmoid(g[i]) * u[i];
}

void swiglu_backward(const float* __restrict g, const float* __restrict u, const float* __restrict dz,
                     float* __restrict dg, float* __restrict du, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(g[i]), gs = g[i] * s;
    du[i] = dz[i] * gs;
    dg[i] = dz[i] * u[i] * (s + gs * (1.0f - s));
  }
}

float exp_sum_row(const float* __restrict x, float shift, std::int64_t C) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t c = 0; c < C; ++c) s += exp_float(x[c] - shift);
  return s;
}

void exp_scale_row(const float* __restrict x, float shift, float ct, float* __restrict dx, std::int64_t C) {
  for (std::int64_t c = 0; c < C; ++c) dx[c] = ct * exp_float(x[c] - shift);
}

void adamw_update(const AdamWStep& h, const float* __restrict p, const float* __restrict g,
                  const float* __restrict m, const float* __restrict v, float* __restrict p_out,
                  float* __restrict m_out, float* __restrict v_out, std::int64_t n) {
  const float b1 = h.b1, b2 = h.b2, a1 = 1.0f - h.b1, a2 = 1.0f - h.b2;
  const float c1 = h.c1, c2 = h.c2, eps = h.eps, wd = h.weight_decay, lr = h.lr;
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = g[i], pi = p[i];
    const float mi = m[i] * b1 + gi * a1;
    const float vi = v[i] * b2 + gi * gi * a2;
    const float upd = (mi / c1) / (std::sqrt(vi / c2) + eps) + pi * wd;
    m_out[i] = mi;
    v_out[i] = vi;
    p_out[i] = pi - upd * lr;
  }
}

// One row of RMSNorm: returns rstd. Sums in float with the loop vectorized (8 or 16 partial
// sums), the same reassociation a BLAS dot makes.
float rms_norm_row(const float* x, const float* scale, float eps, float* y, std::int64_t C) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (std::int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
  for (std::int64_t c = 0; c < C; ++c) y[c] = x[c] * r * scale[c];
  return r;
}

// One row of the RMSNorm vjp; adds this row's dy * x * rstd into dscale.
void rms_norm_backward_row(const float* x, const float* scale, float r, const float* dy, float* dx, float* dscale,
                           std::int64_t C) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (std::int64_t c = 0; c < C; ++c) dot += x[c] * dy[c] * scale[c];
  const float k = r * r * r * dot / static_cast<float>(C);
  for (std::int64_t c = 0; c < C; ++c) {
    dx[c] = r * dy[c] * scale[c] - x[c] * k;
    dscale[c] += dy[c] * x[c] * r;
  }
}

// One head vector of the rotary embedding (sn is the sine, already negated for the inverse).
void rotary_row(const float* x, const float* c, const float* sn, float* out, std::int64_t H, std::int64_t half) {
  for (std::int64_t j = 0; j < half; ++j) {
    const float x1 = x[j], x2 = x[half + j];
    out[j] = x1 * c[j] - x2 * sn[j];
    out[half + j] = x2 * c[j] + x1 * sn[j];
  }
  for (std::int64_t j = 2 * half; j < H; ++j) out[j] = x[j];
}

}  // namespace shardlab::kernels::SHARDLAB_ISA_NS
