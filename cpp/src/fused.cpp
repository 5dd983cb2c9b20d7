// Fused elementwise kernels: ISA dispatch, OpenMP chunking, and the references.
#include "shardlab/fused.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "shardlab/cpu_features.hpp"

namespace shardlab {

// The per-ISA builds of the loops (cpp/src/kernels/fused_rows*.cpp).
#define SHARDLAB_DECLARE_FUSED(NS)                                                                    \
  namespace fused_detail::NS {                                                                         \
  void silu_forward(const float*, float*, std::int64_t);                                               \
  void silu_backward(const float*, const float*, float*, std::int64_t);                                \
  void adamw_update(const AdamWStep&, const float*, const float*, const float*, const float*, float*, \
                    float*, float*, std::int64_t);                                                     \
  }
SHARDLAB_DECLARE_FUSED(scalar)
SHARDLAB_DECLARE_FUSED(avx2)
SHARDLAB_DECLARE_FUSED(avx512)
#undef SHARDLAB_DECLARE_FUSED

namespace {

// Chunks of this many elements: a few L2-sized pieces per thread, and no threads at all for
// arrays a thread hand-off would cost more than (the kernels run ~1 ns per element).
constexpr std::int64_t kChunk = 1 << 14;

template <class Body>
void for_chunks(std::int64_t n, Body&& body) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    if (n > 0) body(0, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t lo = c * kChunk;
    body(lo, std::min(n, lo + kChunk));
  }
}

#define SHARDLAB_FUSED_DISPATCH(FN, ...)                       \
  switch (active_isa()) {                                      \
    case Isa::avx512bf16:                                      \
    case Isa::avx512: fused_detail::avx512::FN(__VA_ARGS__); break; \
    case Isa::avx2: fused_detail::avx2::FN(__VA_ARGS__); break;     \
    case Isa::scalar: fused_detail::scalar::FN(__VA_ARGS__); break; \
  }

float sigmoid_reference(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void silu_forward(const float* x, float* y, std::int64_t n) {
  for_chunks(n, [&](std::int64_t lo, std::int64_t hi) { SHARDLAB_FUSED_DISPATCH(silu_forward, x + lo, y + lo, hi - lo) });
}

void silu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  for_chunks(n, [&](std::int64_t lo, std::int64_t hi) {
    SHARDLAB_FUSED_DISPATCH(silu_backward, x + lo, dy + lo, dx + lo, hi - lo)
  });
}

void adamw_update(const AdamWStep& h, const float* p, const float* g, const float* m, const float* v,
                  float* p_out, float* m_out, float* v_out, std::int64_t n) {
  for_chunks(n, [&](std::int64_t lo, std::int64_t hi) {
    SHARDLAB_FUSED_DISPATCH(adamw_update, h, p + lo, g + lo, m + lo, v + lo, p_out + lo, m_out + lo, v_out + lo,
                            hi - lo)
  });
}

#undef SHARDLAB_FUSED_DISPATCH

void silu_forward_reference(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_reference(x[i]);
}

void silu_backward_reference(const float* x, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_reference(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

void adamw_update_reference(const AdamWStep& h, const float* p, const float* g, const float* m, const float* v,
                            float* p_out, float* m_out, float* v_out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    m_out[i] = h.b1 * m[i] + (1.0f - h.b1) * g[i];
    v_out[i] = h.b2 * v[i] + (1.0f - h.b2) * g[i] * g[i];
    const float m_hat = m_out[i] / h.c1, v_hat = v_out[i] / h.c2;
    p_out[i] = p[i] - h.lr * (m_hat / (std::sqrt(v_hat) + h.eps) + h.weight_decay * p[i]);
  }
}

}  // namespace shardlab
