// Fused elementwise kernels: ISA dispatch, chunking over the thread pool, and the references.
#include "shardlab/fused.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/fused_rows.hpp"
#include "shardlab/thread_pool.hpp"

namespace shardlab {


namespace {

// Chunks of this many elements: a few L2-sized pieces per thread, and no threads at all for
// arrays a thread hand-off would cost more than (the kernels run ~1 ns per element).
constexpr std::int64_t kChunk = 1 << 14;

template <class Body>
void for_chunks(std::int64_t n, Body&& body) {
  parallel_for_runs(n, kChunk, max_threads(), body);
}

// Rows per chunk of for_row_chunks: about kChunk elements.
std::int64_t rows_per_chunk(std::int64_t cols) {
  return std::max<std::int64_t>(1, kChunk / std::max<std::int64_t>(cols, 1));
}

// body(r) for each of `rows` rows of `cols` elements, in chunks of about kChunk elements over
// the threads (one thread for small arrays).
template <class Body>
void for_row_chunks(std::int64_t rows, std::int64_t cols, Body&& body) {
  parallel_for_runs(rows, rows_per_chunk(cols), max_threads(), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) body(r);
  });
}


float sigmoid_reference(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void silu_forward(const float* x, float* y, std::int64_t n) {
  const auto fn = SHARDLAB_KERNEL(silu_forward);
  for_chunks(n, [&](std::int64_t lo, std::int64_t hi) { fn(x + lo, y + lo, hi - lo); });
}

void silu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  const auto fn = SHARDLAB_KERNEL(silu_backward);
  for_chunks(n, [&](std::int64_t lo, std::int64_t hi) { fn(x + lo, dy + lo, dx + lo, hi - lo); });
}

std::int64_t RowsView::rows() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const float* RowsView::row(std::int64_t r) const {
  std::int64_t off = 0;
  for (std::size_t d = shape.size(); d-- > 0;) {
    off += (r % shape[d]) * strides[d];
    r /= shape[d];
  }
  return data + off;
}

void swiglu_forward(const RowsView& x, std::int64_t F, float* z) {
  const auto fn = SHARDLAB_KERNEL(swiglu_forward);
  for_row_chunks(x.rows(), F, [&](std::int64_t r) {
    const float* g = x.row(r);
    fn(g, g + F, z + r * F, F);
  });
}

void swiglu_backward(const RowsView& x, const RowsView& dz, std::int64_t F, float* dx) {
  const auto fn = SHARDLAB_KERNEL(swiglu_backward);
  for_row_chunks(x.rows(), F, [&](std::int64_t r) {
    const float* g = x.row(r);
    float* d = dx + r * 2 * F;
    fn(g, g + F, dz.row(r), d, d + F, F);
  });
}

void exp_sum_forward(const RowsView& x, const float* shift, std::int64_t C, float* s) {
  const auto fn = SHARDLAB_KERNEL(exp_sum_row);
  for_row_chunks(x.rows(), C, [&](std::int64_t r) { s[r] = fn(x.row(r), shift[r], C); });
}

void exp_sum_backward(const RowsView& x, const float* shift, const float* ct, std::int64_t C, float* dx) {
  const auto fn = SHARDLAB_KERNEL(exp_scale_row);
  for_row_chunks(x.rows(), C, [&](std::int64_t r) { fn(x.row(r), shift[r], ct[r], dx + r * C, C); });
}

void adamw_update(const AdamWStep& h, const float* p, const float* g, const float* m, const float* v,
                  float* p_out, float* m_out, float* v_out, std::int64_t n) {
  const auto fn = SHARDLAB_KERNEL(adamw_update);
  for_chunks(n, [&](std::int64_t lo, std::int64_t hi) {
    fn(h, p + lo, g + lo, m + lo, v + lo, p_out + lo, m_out + lo, v_out + lo, hi - lo);
  });
}

void rms_norm_forward(const float* x, const float* scale, float eps, float* y, float* rstd, std::int64_t P,
                      std::int64_t R, std::int64_t C) {
  const auto row = SHARDLAB_KERNEL(rms_norm_row);
  for_row_chunks(P * R, C, [&](std::int64_t i) { rstd[i] = row(x + i * C, scale + (i / R) * C, eps, y + i * C, C); });
}

void rotary_embedding(const float* x, const float* cos, const float* sin, float* out, bool inverse, std::int64_t P,
                      std::int64_t B, std::int64_t T, std::int64_t N, std::int64_t H, std::int64_t half) {
  const auto row = SHARDLAB_KERNEL(rotary_row);
  for_row_chunks(P * B * T, N * H, [&](std::int64_t i) {  // row i holds N head vectors of H
    static thread_local std::vector<float> neg;
    const std::int64_t p = i / (B * T), t = i % T;
    const float* c = cos + (p * T + t) * half;
    const float* s = sin + (p * T + t) * half;
    if (inverse) {
      neg.resize(static_cast<std::size_t>(half));
      for (std::int64_t j = 0; j < half; ++j) neg[static_cast<std::size_t>(j)] = -s[j];
      s = neg.data();
    }
    for (std::int64_t n = 0; n < N; ++n) row(x + (i * N + n) * H, c, s, out + (i * N + n) * H, H, half);
  });
}

void rms_norm_backward(const float* x, const float* scale, const float* rstd, const float* dy, float* dx,
                       float* dscale, std::int64_t P, std::int64_t R, std::int64_t C) {
  const auto row = SHARDLAB_KERNEL(rms_norm_backward_row);
  // Each chunk of rows sums its rows' dscale into its own partial over the groups p it covers;
  // the partials are added in chunk order afterwards, so the result does not depend on which
  // thread ran which chunk.
  const std::int64_t rows = P * R, per = rows_per_chunk(C), chunks = (rows + per - 1) / per;
  std::vector<std::vector<float>> parts(static_cast<std::size_t>(chunks));
  parallel_for_runs(rows, per, max_threads(), [&](std::int64_t r0, std::int64_t r1) {
    const std::int64_t p0 = r0 / R;
    std::vector<float>& part = parts[static_cast<std::size_t>(r0 / per)];
    part.assign(static_cast<std::size_t>(((r1 - 1) / R - p0 + 1) * C), 0.0f);
    for (std::int64_t i = r0; i < r1; ++i) {
      const std::int64_t p = i / R;
      row(x + i * C, scale + p * C, rstd[i], dy + i * C, dx + i * C, part.data() + (p - p0) * C, C);
    }
  });
  std::fill(dscale, dscale + P * C, 0.0f);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::vector<float>& part = parts[static_cast<std::size_t>(c)];
    float* d = dscale + (c * per / R) * C;
    for (std::size_t j = 0; j < part.size(); ++j) d[j] += part[j];
  }
}


void silu_forward_reference(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_reference(x[i]);
}

void silu_backward_reference(const float* x, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_reference(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

void swiglu_forward_reference(const RowsView& x, std::int64_t F, float* z) {
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    const float *g = x.row(r), *u = g + F;
    for (std::int64_t j = 0; j < F; ++j) z[r * F + j] = g[j] * sigmoid_reference(g[j]) * u[j];
  }
}

void swiglu_backward_reference(const RowsView& x, const RowsView& dz, std::int64_t F, float* dx) {
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    const float *g = x.row(r), *u = g + F, *d = dz.row(r);
    for (std::int64_t j = 0; j < F; ++j) {
      const float s = sigmoid_reference(g[j]);
      dx[r * 2 * F + j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
      dx[r * 2 * F + F + j] = d[j] * g[j] * s;
    }
  }
}

void exp_sum_forward_reference(const RowsView& x, const float* shift, std::int64_t C, float* s) {
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    double acc = 0.0;
    for (std::int64_t c = 0; c < C; ++c) acc += std::exp(static_cast<double>(x.row(r)[c] - shift[r]));
    s[r] = static_cast<float>(acc);
  }
}

void exp_sum_backward_reference(const RowsView& x, const float* shift, const float* ct, std::int64_t C, float* dx) {
  for (std::int64_t r = 0; r < x.rows(); ++r) {
    for (std::int64_t c = 0; c < C; ++c) {
      dx[r * C + c] = static_cast<float>(ct[r] * std::exp(static_cast<double>(x.row(r)[c] - shift[r])));
    }
  }
}

void rms_norm_forward_reference(const float* x, const float* scale, float eps, float* y, float* rstd,
                                std::int64_t P, std::int64_t R, std::int64_t C) {
  for (std::int64_t i = 0; i < P * R; ++i) {
    double ss = 0.0;
    for (std::int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[i * C + c]) * x[i * C + c];
    rstd[i] = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(C) + eps));
    for (std::int64_t c = 0; c < C; ++c) y[i * C + c] = x[i * C + c] * rstd[i] * scale[(i / R) * C + c];
  }
}

void rms_norm_backward_reference(const float* x, const float* scale, const float* rstd, const float* dy,
                                 float* dx, float* dscale, std::int64_t P, std::int64_t R, std::int64_t C) {
  for (std::int64_t j = 0; j < P * C; ++j) dscale[j] = 0.0f;
  for (std::int64_t i = 0; i < P * R; ++i) {
    const float* sc = scale + (i / R) * C;
    const double r = rstd[i];
    double dot = 0.0;
    for (std::int64_t c = 0; c < C; ++c) dot += static_cast<double>(x[i * C + c]) * dy[i * C + c] * sc[c];
    for (std::int64_t c = 0; c < C; ++c) {
      dx[i * C + c] = static_cast<float>(r * dy[i * C + c] * sc[c] - x[i * C + c] * r * r * r * dot / C);
      dscale[(i / R) * C + c] += static_cast<float>(dy[i * C + c] * x[i * C + c] * r);
    }
  }
}

void rotary_embedding_reference(const float* x, const float* cos, const float* sin, float* out, bool inverse,
                                std::int64_t P, std::int64_t B, std::int64_t T, std::int64_t N, std::int64_t H,
                                std::int64_t half) {
  for (std::int64_t p = 0; p < P; ++p)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t n = 0; n < N; ++n) {
          const float* xr = x + (((p * B + b) * T + t) * N + n) * H;
          float* o = out + (((p * B + b) * T + t) * N + n) * H;
          const float* c = cos + (p * T + t) * half;
          const float* s = sin + (p * T + t) * half;
          for (std::int64_t j = 0; j < H; ++j) {
            if (j >= 2 * half) {
              o[j] = xr[j];
            } else if (j < half) {  // x1 c - x2 s
              o[j] = static_cast<float>(double{xr[j]} * c[j] - (inverse ? -1.0 : 1.0) * xr[j + half] * s[j]);
            } else {  // x2 c + x1 s
              const std::int64_t k = j - half;
              o[j] = static_cast<float>(double{xr[j]} * c[k] + (inverse ? -1.0 : 1.0) * xr[k] * s[k]);
            }
          }
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
