// Fused elementwise kernels: one pass over memory where the composite numpy expression makes
// several (the training step's activation and optimizer update). float32, contiguous, any
// length; parallel over the thread pool (thread_pool.hpp) for long arrays, vectorized per ISA
// (scalar, AVX2, AVX-512 builds of one loop). Each has an element-at-a-time reference beside it.
#pragma once

#include <cstdint>
#include <vector>

namespace shardlab {

// y = x * sigmoid(x) (SiLU / swish).
void silu_forward(const float* x, float* y, std::int64_t n);
// dx = dy * s * (1 + x * (1 - s)) with s = sigmoid(x): the vjp of silu_forward.
void silu_backward(const float* x, const float* dy, float* dx, std::int64_t n);

// An array viewed as rows of contiguous floats, the leading dims at any strides (a slice of
// the last dim, or storage whose mesh dims a matmul left permuted, is read in place): row r
// starts at data + sum_d i_d * strides[d], (i_0, i_1, ...) = r unravelled over `shape`
// (row-major), strides in elements.
struct RowsView {
  const float* data;
  std::vector<std::int64_t> shape, strides;
  std::int64_t rows() const;
  const float* row(std::int64_t r) const;
};

// SwiGLU on rows of 2F values [gate | up] (jax.nn.glu's layout, with silu as the gate):
// z[r, j] = silu(g_j) * u_j with g = x[r, :F], u = x[r, F:2F]; z is C-contiguous [rows, F].
void swiglu_forward(const RowsView& x, std::int64_t F, float* z);
// Its vjp, one pass, dx C-contiguous [rows, 2F]: with s = sigmoid(g),
//   dx[r, :F] = dz * u * s * (1 + g * (1 - s)),  dx[r, F:] = dz * g * s.
void swiglu_backward(const RowsView& x, const RowsView& dz, std::int64_t F, float* dx);

// s[r] = sum_c exp(x[r, c] - shift[r]) over the rows of x (C columns; shift C-contiguous
// [rows]): the sum of a softmax (or logsumexp) without the [rows, C] exponentials in memory.
void exp_sum_forward(const RowsView& x, const float* shift, std::int64_t C, float* s);
// dx[r, c] = ct[r] * exp(x[r, c] - shift[r]), dx C-contiguous [rows, C]: its vjp in x.
void exp_sum_backward(const RowsView& x, const float* shift, const float* ct, std::int64_t C, float* dx);

// One AdamW step on n elements, as optax/Loshchilov & Hutter, with bias corrections c1 =
// 1 - b1^t and c2 = 1 - b2^t given by the caller:
//   m' = b1 m + (1 - b1) g;  v' = b2 v + (1 - b2) g^2
//   p' = p - lr * ((m' / c1) / (sqrt(v' / c2) + eps) + weight_decay * p)
struct AdamWStep {
  float lr, b1, b2, eps, weight_decay, c1, c2;
};
void adamw_update(const AdamWStep& h, const float* p, const float* g, const float* m, const float* v,
                  float* p_out, float* m_out, float* v_out, std::int64_t n);

// RMSNorm over the last dim of x [P, R, C] (P groups, e.g. devices, each with its own scale
// row [P, C]; R rows of C): rstd[p, r] = 1 / sqrt(mean_c x^2 + eps), y = x * rstd * scale.
void rms_norm_forward(const float* x, const float* scale, float eps, float* y, float* rstd, std::int64_t P,
                      std::int64_t R, std::int64_t C);
// Its vjp from the saved rstd: with g = dy * scale,
//   dx = rstd * g - x * rstd^3 * mean_c(x * g),  dscale[p, c] = sum_r dy * x * rstd.
void rms_norm_backward(const float* x, const float* scale, const float* rstd, const float* dy, float* dx,
                       float* dscale, std::int64_t P, std::int64_t R, std::int64_t C);

// Rotary position embedding, "rotate half" layout (LLaMA, GPT-NeoX), on x [P, B, T, N, H]
// with tables cos, sin [P, T, half] (2 half <= H): per (p, b, t, n) with c, s the table row,
//   out[:half] = x1 c - x2 s,  out[half:2 half] = x2 c + x1 s,  out[2 half:] = x[2 half:]
// where x1 = x[:half], x2 = x[half:2 half]. inverse = true rotates by -angle (s -> -s): the
// transpose, so the vjp is the same kernel.
void rotary_embedding(const float* x, const float* cos, const float* sin, float* out, bool inverse, std::int64_t P,
                      std::int64_t B, std::int64_t T, std::int64_t N, std::int64_t H, std::int64_t half);

// The definitions, one element at a time with std::exp and std::sqrt: what the tests hold the
// fused kernels to.
void silu_forward_reference(const float* x, float* y, std::int64_t n);
void silu_backward_reference(const float* x, const float* dy, float* dx, std::int64_t n);
void swiglu_forward_reference(const RowsView& x, std::int64_t F, float* z);
void swiglu_backward_reference(const RowsView& x, const RowsView& dz, std::int64_t F, float* dx);
void exp_sum_forward_reference(const RowsView& x, const float* shift, std::int64_t C, float* s);
void exp_sum_backward_reference(const RowsView& x, const float* shift, const float* ct, std::int64_t C, float* dx);
void rms_norm_forward_reference(const float* x, const float* scale, float eps, float* y, float* rstd,
                                std::int64_t P, std::int64_t R, std::int64_t C);
void rms_norm_backward_reference(const float* x, const float* scale, const float* rstd, const float* dy,
                                 float* dx, float* dscale, std::int64_t P, std::int64_t R, std::int64_t C);
void rotary_embedding_reference(const float* x, const float* cos, const float* sin, float* out, bool inverse,
                                std::int64_t P, std::int64_t B, std::int64_t T, std::int64_t N, std::int64_t H,
                                std::int64_t half);
void adamw_update_reference(const AdamWStep& h, const float* p, const float* g, const float* m, const float* v,
                            float* p_out, float* m_out, float* v_out, std::int64_t n);

}  // namespace shardlab
