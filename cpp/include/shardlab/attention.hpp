// Flash attention on the CPU: tiled forward and backward with an online softmax, plus a
// materialized-softmax reference beside it.
//
// Layout is JAX's: q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D], out like q, all C-contiguous.
// Hq must be a multiple of Hkv (grouped query attention: query head h reads kv head
// h / (Hq / Hkv)). Causal masking is top-left aligned, as jax.nn.dot_product_attention
// (tril of a [Tq, Tk] matrix of ones) and torch SDPA: query i sees keys j <= i.
// The optional boolean mask is indexed [b, h, i, j] through element strides, so a
// broadcast view (stride 0) costs nothing; nonzero = keep, as in JAX.
// Statistics are fp32; bf16 data (stored as uint16) is converted to fp32 in the tiles and
// the bf16 output is rounded (to nearest even) from fp32.
// A row whose keys are all masked gets output 0, logsumexp -inf and gradients 0.
#pragma once

#include <cstdint>

#include "shardlab/dtype.hpp"

namespace shardlab {

struct AttentionProblem {
  int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  bool causal = false;
  DType dtype = DType::float32;       // float32 or bfloat16 (check_attention_problem checks)
  const uint8_t* mask = nullptr;      // optional; element (b, h, i, j) at sum(index * stride)
  int64_t mask_strides[4] = {0, 0, 0, 0};
};

// Throws std::invalid_argument (message starts with `[op]`) when sizes are not positive or
// q_heads is not a multiple of kv_heads.
void check_attention_problem(const AttentionProblem& p, const char* op);

// out: same dtype and shape as q. lse: fp32 [B, Hq, Tq], natural-log logsumexp of the
// scaled, masked logits (-inf for fully masked rows).
void attention_forward(const AttentionProblem& p, const void* q, const void* k, const void* v,
                       void* out, float* lse);

// Gradients are written as fp32 (dq like q, dk and dv like k); callers round them for bf16.
// GQA sums dk and dv over the query heads of each group.
void attention_backward(const AttentionProblem& p, const void* q, const void* k, const void* v,
                        const void* out, const void* dout, const float* lse, float* dq,
                        float* dk, float* dv);

// The materialized-softmax reference (double accumulation, O(Tq * Tk) memory per head):
// the definition every fast path is tested against. Same contracts as above.
void attention_reference_forward(const AttentionProblem& p, const void* q, const void* k,
                                 const void* v, void* out, float* lse);
void attention_reference_backward(const AttentionProblem& p, const void* q, const void* k,
                                  const void* v, const void* dout, float* dq, float* dk,
                                  float* dv);

}  // namespace shardlab
