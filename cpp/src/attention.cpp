// Flash attention: argument checks, ISA dispatch, the scalar path and the materialized
// reference. The tiled algorithm itself is in kernels/attention_tile.hpp.
#include "shardlab/attention.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention_tile.hpp"
#include "kernels/dispatch.hpp"
#include "shardlab/buffer_pool.hpp"
#include "shardlab/cpu_features.hpp"

namespace shardlab {
namespace {

// W = 1 "vectors": the same tiles and loops, left to the compiler's baseline code generation.
struct VecScalar {
  using R = float;
  static constexpr int W = 1, MR = 4, NV = 4, BQ = 64, BK = 64;
  static R zero() { return 0.0f; }
  static R load(const float* p) { return *p; }
  static void store(float* p, R x) { *p = x; }
  static R set1(float x) { return x; }
  static R fma(R a, R b, R c) { return a * b + c; }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R max(R a, R b) { return a > b ? a : b; }
  static R exp2(R x) { return std::exp2(x); }
};

template <class T>
double at(const void* base, int64_t i) {
  return static_cast<double>(detail::widen(static_cast<const T*>(base)[i]));
}

double load(const AttentionProblem& p, const void* base, int64_t i) {
  return p.dtype == DType::float32 ? at<float>(base, i) : at<uint16_t>(base, i);
}

void store(const AttentionProblem& p, void* base, int64_t i, double x) {
  if (p.dtype == DType::float32) {
    static_cast<float*>(base)[i] = static_cast<float>(x);
  } else {
    static_cast<uint16_t*>(base)[i] = float_to_bf16(static_cast<float>(x));
  }
}

// P[i * Tk + j] for one (b, h): softmax of the scaled, masked logits, rows of zeros when every
// key is masked. Returns each row's logsumexp.
std::vector<double> reference_probs(const AttentionProblem& p, const void* q, const void* k,
                                    int64_t b, int64_t h, std::vector<double>& P) {
  const int64_t Tq = p.q_len, Tk = p.kv_len, D = p.head_dim, Hq = p.q_heads;
  const int64_t Hkv = p.kv_heads, hk = h / (Hq / Hkv);
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> lse(Tq);
  for (int64_t i = 0; i < Tq; ++i) {
    double* row = P.data() + i * Tk;
    double mx = ninf;
    for (int64_t j = 0; j < Tk; ++j) {
      bool keep = !(p.causal && j > i);
      if (p.mask) keep = keep && detail::mask_keep(p, b, h, i, j);
      double s = ninf;
      if (keep) {
        s = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          s += load(p, q, ((b * Tq + i) * Hq + h) * D + d) *
               load(p, k, ((b * Tk + j) * Hkv + hk) * D + d);
        }
        s *= p.scale;
      }
      row[j] = s;
      mx = std::max(mx, s);
    }
    double l = 0.0;
    for (int64_t j = 0; j < Tk; ++j) {
      row[j] = mx == ninf ? 0.0 : std::exp(row[j] - mx);
      l += row[j];
    }
    for (int64_t j = 0; j < Tk; ++j) row[j] = l > 0.0 ? row[j] / l : 0.0;
    lse[i] = l > 0.0 ? mx + std::log(l) : ninf;
  }
  return lse;
}

}  // namespace

// The scalar build of the tiled kernels (dispatch.hpp).
namespace kernels::scalar {

void attention_forward(const AttentionProblem& p, const void* q, const void* k, const void* v, void* out,
                       float* lse) {
  detail::forward_dispatch<VecScalar>(p, q, k, v, out, lse);
}

void attention_backward(const AttentionProblem& p, const void* q, const void* k, const void* v, const void* out,
                        const void* dout, const float* lse, float* dq, float* dk, float* dv) {
  detail::backward_dispatch<VecScalar>(p, q, k, v, out, dout, lse, dq, dk, dv);
}

}  // namespace kernels::scalar

void check_attention_problem(const AttentionProblem& p, const char* op) {
  const std::string name = std::string("[") + op + "] ";
  if (p.batch < 1 || p.q_len < 1 || p.kv_len < 1 || p.q_heads < 1 || p.kv_heads < 1 ||
      p.head_dim < 1) {
    throw std::invalid_argument(
        name + "every size must be positive, got batch " + std::to_string(p.batch) +
        ", q_len " + std::to_string(p.q_len) + ", kv_len " + std::to_string(p.kv_len) +
        ", q_heads " + std::to_string(p.q_heads) + ", kv_heads " + std::to_string(p.kv_heads) +
        ", head_dim " + std::to_string(p.head_dim));
  }
  if (p.dtype != DType::float32 && p.dtype != DType::bfloat16) {
    throw std::invalid_argument(name + "dtype " + dtype_name(p.dtype) +
                                "; the kernel takes float32 or bfloat16");
  }
  if (p.q_heads % p.kv_heads != 0) {
    throw std::invalid_argument(name + "the number of query heads " +
                                std::to_string(p.q_heads) +
                                " is not a multiple of the number of key/value heads " +
                                std::to_string(p.kv_heads));
  }
}

void attention_forward(const AttentionProblem& p, const void* q, const void* k, const void* v,
                       void* out, float* lse) {
  check_attention_problem(p, "flash_attention");
  SHARDLAB_KERNEL(attention_forward)(p, q, k, v, out, lse);
}

void attention_backward(const AttentionProblem& p, const void* q, const void* k, const void* v,
                        const void* out, const void* dout, const float* lse, float* dq,
                        float* dk, float* dv) {
  check_attention_problem(p, "flash_attention_backward");
  SHARDLAB_KERNEL(attention_backward)(p, q, k, v, out, dout, lse, dq, dk, dv);
}

void attention_reference_forward(const AttentionProblem& p, const void* q, const void* k,
                                 const void* v, void* out, float* lse) {
  check_attention_problem(p, "attention_reference");
  const int64_t Tq = p.q_len, Tk = p.kv_len, D = p.head_dim, Hq = p.q_heads;
  const int64_t Hkv = p.kv_heads;
  check_alloc("attention_reference", double(Tq) * double(Tk) * sizeof(double),
              "the reference materializes the [Tq, Tk] probabilities in float64; use the flash kernel");
  std::vector<double> P(Tq * Tk);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      const std::vector<double> l = reference_probs(p, q, k, b, h, P);
      for (int64_t i = 0; i < Tq; ++i) {
        lse[(b * Hq + h) * Tq + i] = static_cast<float>(l[i]);
        for (int64_t d = 0; d < D; ++d) {
          double o = 0.0;
          for (int64_t j = 0; j < Tk; ++j) {
            o += P[i * Tk + j] * load(p, v, ((b * Tk + j) * Hkv + hk) * D + d);
          }
          store(p, out, ((b * Tq + i) * Hq + h) * D + d, o);
        }
      }
    }
  }
}

void attention_reference_backward(const AttentionProblem& p, const void* q, const void* k,
                                  const void* v, const void* dout, float* dq, float* dk,
                                  float* dv) {
  check_attention_problem(p, "attention_reference_backward");
  const int64_t Tq = p.q_len, Tk = p.kv_len, D = p.head_dim, Hq = p.q_heads;
  const int64_t Hkv = p.kv_heads;
  check_alloc("attention_reference_backward", 2.0 * double(Tq) * double(Tk) * sizeof(double),
              "the reference materializes the [Tq, Tk] probabilities and their gradient in float64; use the "
              "flash kernel");
  std::vector<double> P(Tq * Tk), dS(Tq * Tk);
  std::vector<double> dk64(p.batch * Tk * Hkv * D, 0.0), dv64(dk64.size(), 0.0);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      reference_probs(p, q, k, b, h, P);
      auto qi = [&](int64_t i, int64_t d) { return ((b * Tq + i) * Hq + h) * D + d; };
      auto kj = [&](int64_t j, int64_t d) { return ((b * Tk + j) * Hkv + hk) * D + d; };
      for (int64_t i = 0; i < Tq; ++i) {
        double delta = 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          double dp = 0.0;
          for (int64_t d = 0; d < D; ++d) dp += load(p, dout, qi(i, d)) * load(p, v, kj(j, d));
          dS[i * Tk + j] = dp;
          delta += P[i * Tk + j] * dp;
        }
        for (int64_t j = 0; j < Tk; ++j) {
          dS[i * Tk + j] = P[i * Tk + j] * (dS[i * Tk + j] - delta) * p.scale;
        }
      }
      for (int64_t i = 0; i < Tq; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          double g = 0.0;
          for (int64_t j = 0; j < Tk; ++j) g += dS[i * Tk + j] * load(p, k, kj(j, d));
          dq[qi(i, d)] = static_cast<float>(g);
        }
      }
      for (int64_t j = 0; j < Tk; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          double gk = 0.0, gv = 0.0;
          for (int64_t i = 0; i < Tq; ++i) {
            gk += dS[i * Tk + j] * load(p, q, qi(i, d));
            gv += P[i * Tk + j] * load(p, dout, qi(i, d));
          }
          dk64[kj(j, d)] += gk;
          dv64[kj(j, d)] += gv;
        }
      }
    }
  }
  for (size_t x = 0; x < dk64.size(); ++x) {
    dk[x] = static_cast<float>(dk64[x]);
    dv[x] = static_cast<float>(dv64[x]);
  }
}

}  // namespace shardlab
