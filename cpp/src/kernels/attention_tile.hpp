// The tiled flash-attention algorithm, written once and instantiated by each per-ISA file with
// its vector type V (attention_avx512.cpp, attention_avx2.cpp, and the scalar one in
// attention.cpp). Everything here has internal linkage: each translation unit is compiled
// with different ISA flags, and sharing an inline function between them would let the linker
// keep an AVX-512 copy for the scalar path.
//
// V provides: R (register type), W (floats per register), MR x NV (micro-tile: MR rows by NV
// registers of columns), BQ x BK (query and key rows per tile, multiples of 16; best when
// multiples of MR too, so no tile runs a short micro-tile), zero/load/store/set1/fma/mul/add/
// sub/max and exp2 (inputs clamped to [-127, 127], exp2(-127 or less) == 0 exactly, so -inf
// gives 0).
//
// All tiles are fp32 with row lengths padded to a multiple of 16 and zero-filled, so the
// micro-kernels never handle column tails; row tails are handled by smaller MR instances.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "shardlab/attention.hpp"
#include "shardlab/buffer_pool.hpp"
#include "shardlab/thread_pool.hpp"
#include "transpose8x8.hpp"

// The tiled kernels of one ISA (dispatch.hpp): attention.cpp (scalar), attention_avx2.cpp,
// attention_avx512.cpp.
namespace shardlab::kernels {
#define SHARDLAB_DECLARE_ATTENTION(ISA)                                                                  \
  namespace ISA {                                                                                        \
  void attention_forward(const AttentionProblem&, const void*, const void*, const void*, void*, float*); \
  void attention_backward(const AttentionProblem&, const void*, const void*, const void*, const void*,   \
                          const void*, const float*, float*, float*, float*);                           \
  }
SHARDLAB_DECLARE_ATTENTION(scalar)
SHARDLAB_DECLARE_ATTENTION(avx2)
SHARDLAB_DECLARE_ATTENTION(avx512)
#undef SHARDLAB_DECLARE_ATTENTION
namespace avx512bf16 {
using avx512::attention_backward;
using avx512::attention_forward;
}  // namespace avx512bf16
}  // namespace shardlab::kernels

namespace shardlab::detail {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kInf = std::numeric_limits<float>::infinity();

inline int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }

// Row stride (floats) of the tiles and head-major copies whose rows a GEMM reads as its B
// operand, 16 columns at a time down all rows: an odd number of 64-byte lines, so those rows
// spread over every set of the L1 cache. With Dp = 128 (8 lines, 512 bytes) the 96 lines of
// one such column block fell in 8 of the 64 sets, which hold 64 lines, and every pass over
// the block missed L1 (the forward's P V and four of the backward's five products).
inline int64_t row_ld(int64_t Dp) { return Dp / 16 % 2 ? Dp : Dp + 16; }

// A cache-line aligned buffer kept between calls by its thread: the head-major copies of K and
// V (or Q and dO) are megabytes, and fresh pages cost a page fault and a zero-fill each, a few
// percent of a causal forward. Each thread's tiles live in one too: aligned to a cache line,
// so with every tile a multiple of 16 floats long no 32-byte load of a row straddles two lines
// (std::vector's 16-byte alignment made every other AVX2 load of a panel split, costing a
// tenth of the micro-kernel's speed). trim() after a call gives back anything above
// kKeepBytes, so a huge call does not pin its copies for the life of the thread.
class Scratch {
 public:
  static constexpr int64_t kKeepBytes = int64_t{32} << 20;
  void trim() {
    if (capacity_ * int64_t(sizeof(float)) > kKeepBytes) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
    }
  }
  float* get(int64_t floats) {
    if (floats > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
      const int64_t want = pad16(floats);
      data_ = static_cast<float*>(aligned_allocate("flash_attention", 64, want * sizeof(float)));
      capacity_ = want;
    }
    return data_;
  }
  ~Scratch() { std::free(data_); }

 private:
  float* data_ = nullptr;
  int64_t capacity_ = 0;
};
inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return bf16_to_float(x); }
inline void narrow(float x, float* d) { *d = x; }
inline void narrow(float x, uint16_t* d) { *d = float_to_bf16(x); }

// C[i, :] = (accumulate ? C[i, :] * (rowscale ? rowscale[i] : 1) : 0) + sum_k A(i, k) B[k, :]
// for an MR x (NV * W) tile, A(i, k) = A[i * rsa + k * csa] broadcast from memory. With
// `colmax`, colmax[c] = max(colmax[c], C[i, c] over the tile's rows) as well (the forward's
// per-query running max, taken while the scores are still in registers).
template <class V, int MR, int NV>
inline void micro_tile(int64_t kc, const float* A, int64_t rsa, int64_t csa, const float* B,
                       int64_t ldb, float* C, int64_t ldc, bool accumulate,
                       const float* rowscale, float* colmax) {
  // The products are summed first and C (scaled) added at the end, so the C rows, which may
  // be cold (dQ rows lie H * D floats apart), load while the k loop runs.
  typename V::R acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (accumulate) {
      __builtin_prefetch(C + i * ldc, 1, 3);
      __builtin_prefetch(C + i * ldc + NV * V::W - 1, 1, 3);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  }
  // Pointers step through k (no k * stride products in the loop), four k per iteration.
  const float* a = A;
  const float* b = B;
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    typename V::R bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = V::load(b + j * V::W);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const typename V::R av = V::set1(a[i * rsa]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = V::fma(av, bv[j], acc[i][j]);
    }
    a += csa;
    b += ldb;
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const typename V::R s = V::set1(rowscale ? rowscale[i] : 1.0f);
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      if (accumulate && rowscale) {
        acc[i][j] = V::fma(V::load(C + i * ldc + j * V::W), s, acc[i][j]);
      } else if (accumulate) {
        acc[i][j] = V::add(V::load(C + i * ldc + j * V::W), acc[i][j]);
      }
      V::store(C + i * ldc + j * V::W, acc[i][j]);
    }
  }
  if (colmax) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      typename V::R mx = V::load(colmax + j * V::W);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) mx = V::max(mx, acc[i][j]);
      V::store(colmax + j * V::W, mx);
    }
  }
}

// A block to prefetch into L2 a few lines per micro-tile while a GEMM runs (the backward's next
// query tile, or rows the task writes next: a GEMM touching them cold stalls). Contiguous by
// default; with row_lines > 0, rows of row_lines lines row_stride bytes apart (the rows of the
// caller's output, H * D elements apart).
struct Prefetch {
  const char* p = nullptr;
  int64_t lines = 0;
  int64_t row_lines = 0, row_stride = 0;
  int64_t col = 0;
  void issue(int64_t n) {
    for (n = std::min(n, lines); n > 0; --n, --lines) {
      __builtin_prefetch(p + col * 64, 0, 2);
      if (++col == row_lines || row_lines == 0) {
        p += row_lines ? row_stride : 64 * col;
        col = 0;
      }
    }
  }
};

template <class V, int MR>
inline void micro_nv(int nv, int64_t kc, const float* A, int64_t rsa, int64_t csa,
                     const float* B, int64_t ldb, float* C, int64_t ldc, bool acc,
                     const float* rs, float* cm) {
  if constexpr (V::NV >= 4) {
    if (nv == 4) return micro_tile<V, MR, 4>(kc, A, rsa, csa, B, ldb, C, ldc, acc, rs, cm);
  }
  if constexpr (V::NV >= 3) {
    if (nv == 3) return micro_tile<V, MR, 3>(kc, A, rsa, csa, B, ldb, C, ldc, acc, rs, cm);
  }
  if constexpr (V::NV >= 2) {
    if (nv == 2) return micro_tile<V, MR, 2>(kc, A, rsa, csa, B, ldb, C, ldc, acc, rs, cm);
  }
  micro_tile<V, MR, 1>(kc, A, rsa, csa, B, ldb, C, ldc, acc, rs, cm);
}

// What a GEMM on a tile that straddles the causal diagonal may leave out (d is the offset
// between the tile's query and key origins). Skipped micro-tiles of C are not written (the
// caller masks them); skipped k terms are exact zeros (probabilities of hidden keys).
struct Causal {
  enum Mode { none, skip_rows_after_cols, skip_cols_after_rows, k_end, k_begin };
  Mode mode = none;
  int64_t d = 0;
};

// C[M x N] (+)= A(M x K) B[K x N] with N a multiple of V::W (tiles are padded); `colmax` (N
// floats) gets the column maxima of C folded in, see micro_tile. With `causal`:
//   skip_rows_after_cols: micro-tiles whose every row r > every column c + d are skipped;
//   skip_cols_after_rows: micro-tiles whose every column c > every row r + d are skipped;
//   k_end: rows [m0, m0 + mr) sum k < m0 + mr + d only; k_begin: only k >= m0 + d.
template <class V>
inline void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t rsa, int64_t csa,
                 const float* B, int64_t ldb, float* C, int64_t ldc, bool acc,
                 const float* rowscale, float* colmax = nullptr, Prefetch* pf = nullptr,
                 Causal causal = {}) {
  const int64_t tiles = (M + V::MR - 1) / V::MR * ((N / V::W + V::NV - 1) / V::NV);
  const int64_t per_tile = pf ? (pf->lines + tiles - 1) / tiles : 0;
  for (int64_t n0 = 0; n0 < N; n0 += V::NV * V::W) {
    const int nv = static_cast<int>(std::min<int64_t>(V::NV, (N - n0) / V::W));
    for (int64_t m0 = 0; m0 < M; m0 += V::MR) {
      const int mr = static_cast<int>(std::min<int64_t>(V::MR, M - m0));
      if (pf) pf->issue(per_tile);
      int64_t k0 = 0, k1 = K;
      switch (causal.mode) {
        case Causal::none: break;
        case Causal::skip_rows_after_cols:
          if (m0 > n0 + nv * V::W - 1 + causal.d) continue;
          break;
        case Causal::skip_cols_after_rows:
          if (n0 > m0 + mr - 1 + causal.d) continue;
          break;
        case Causal::k_end: k1 = std::clamp<int64_t>(m0 + mr + causal.d, 0, K); break;
        case Causal::k_begin: k0 = std::clamp<int64_t>(m0 + causal.d, 0, K); break;
      }
      const float* a = A + m0 * rsa + k0 * csa;
      const float* b = B + n0 + k0 * ldb;
      float* c = C + m0 * ldc + n0;
      const float* rs = rowscale ? rowscale + m0 : nullptr;
      float* cm = colmax ? colmax + n0 : nullptr;
      const int64_t kc = k1 - k0;
      switch (mr) {
        case 1: micro_nv<V, 1>(nv, kc, a, rsa, csa, b, ldb, c, ldc, acc, rs, cm); break;
        case 2: micro_nv<V, 2>(nv, kc, a, rsa, csa, b, ldb, c, ldc, acc, rs, cm); break;
        case 3: micro_nv<V, 3>(nv, kc, a, rsa, csa, b, ldb, c, ldc, acc, rs, cm); break;
        case 4: micro_nv<V, 4>(nv, kc, a, rsa, csa, b, ldb, c, ldc, acc, rs, cm); break;
        case 5:
          if constexpr (V::MR >= 5) micro_nv<V, 5>(nv, kc, a, rsa, csa, b, ldb, c, ldc, acc, rs, cm);
          break;
        default:
          if constexpr (V::MR >= 6) micro_nv<V, 6>(nv, kc, a, rsa, csa, b, ldb, c, ldc, acc, rs, cm);
          break;
      }
    }
  }
}

// Copies `rows` rows of `cols` elements (source row stride `ld`) into fp32 rows of length
// `ldd`, zero-filling the padding columns.
template <class T>
inline void pack_rows(const T* src, int64_t ld, int64_t rows, int64_t cols, float* dst,
                      int64_t ldd, float mul = 1.0f) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * ld;
    float* d = dst + r * ldd;
    for (int64_t c = 0; c < cols; ++c) d[c] = widen(s[c]) * mul;
    for (int64_t c = cols; c < ldd; ++c) d[c] = 0.0f;
  }
}

#if defined(__AVX2__)
// dst[j * ldd + i] = src[i * ld + j] * mul for an 8 x 8 block (unpack / shuffle / permute).
inline void transpose8x8_f32(const float* src, int64_t ld, float* dst, int64_t ldd, float mul) {
  const __m256 m = _mm256_set1_ps(mul);
  __m256 v[8];
  for (int i = 0; i < 8; ++i) v[i] = _mm256_mul_ps(_mm256_loadu_ps(src + i * ld), m);
  transpose8x8(v);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, v[i]);
}
#endif

// The transpose: dst[c * ldd + r] = src[r * ld + c]; columns r in [rows, rpad) are zeroed.
// fp32 goes through 8 x 8 register transposes where the ISA has them: element by element,
// each store lands on its own line (the destination rows are ldd floats apart).
template <class T>
inline void pack_cols(const T* src, int64_t ld, int64_t rows, int64_t cols, float* dst,
                      int64_t ldd, int64_t rpad, float mul = 1.0f) {
  int64_t r0 = 0;
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    const int64_t c8 = cols / 8 * 8;
    for (; r0 + 8 <= rows; r0 += 8) {
      for (int64_t c = 0; c < c8; c += 8) {
        transpose8x8_f32(src + r0 * ld + c, ld, dst + c * ldd + r0, ldd, mul);
      }
      for (int64_t r = r0; r < r0 + 8; ++r) {
        for (int64_t c = c8; c < cols; ++c) dst[c * ldd + r] = src[r * ld + c] * mul;
      }
    }
  }
#endif
  for (int64_t r = r0; r < rows; ++r) {
    const T* s = src + r * ld;
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = widen(s[c]) * mul;
  }
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = rows; r < rpad; ++r) dst[c * ldd + r] = 0.0f;
  }
}

// x [B, T, H, D] regrouped head-major as fp32 rows [B][H][T][row_ld(Dp)], zero-padded, into
// `dst`.
// The kernels then read every tile as one contiguous block: in place, the rows of a tile lie
// H * D elements apart, each on its own 4 KiB page for H * D * 4 >= 4096 bytes, so a tile of
// 96 rows cost 96 TLB entries and defeated the hardware prefetcher (a tenth of the forward's
// time and more of the backward's went to copying them tile by tile).
// head_major_buffer returns the destination (from `scratch`), or nullptr when x already has
// that layout (fp32, one head, D a multiple of 16) and is read in place (as_f32(x)), with
// row stride D instead.
// pack_heads fills the buffers of two tensors (K and V, or Q and dO) in one parallel loop.
template <class T>
float* head_major_buffer(const T*, int64_t B, int64_t Tn, int64_t H, int64_t D,
                         Scratch& scratch) {
  if constexpr (std::is_same_v<T, float>) {
    if (H == 1 && D == pad16(D)) return nullptr;
  }
  return scratch.get(B * H * Tn * row_ld(pad16(D)));
}

template <class T>
const float* as_f32(const T* x) {
  if constexpr (std::is_same_v<T, float>) return x;
  return nullptr;
}

// Regroups x (see head_major_buffer) into xdst and y into ydst (either may be nullptr: read in
// place), in chunks of token rows over the thread pool.
template <class T>
void pack_heads(const T* x, float* xdst, const T* y, float* ydst, int64_t B, int64_t Tn, int64_t H,
                int64_t D) {
  const int64_t ld = row_ld(pad16(D)), rows = B * Tn;
  const int64_t per = std::max<int64_t>(1, 16384 / std::max<int64_t>(H * D, 1));
  const int64_t chunks = (rows + per - 1) / per;
  const int64_t nx = xdst ? chunks : 0, ny = ydst ? chunks : 0;
  parallel_for(nx + ny, rows * H * D >= 16384 ? max_threads() : 1, [&](int64_t c) {
    const T* src = c < nx ? x : y;
    float* dst = c < nx ? xdst : ydst;
    const int64_t r0 = (c < nx ? c : c - nx) * per;
    for (int64_t r = r0; r < std::min(rows, r0 + per); ++r) {
      const int64_t b = r / Tn, t = r % Tn;
      for (int64_t h = 0; h < H; ++h) {
        pack_rows(src + (r * H + h) * D, D, 1, D, dst + ((b * H + h) * Tn + t) * ld, ld);
      }
    }
  });
}

inline bool mask_keep(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t* s = p.mask_strides;
  return p.mask[b * s[0] + h * s[1] + i * s[2] + j * s[3]] != 0;
}

// Forward, one task per (batch, query head, query tile). The scores are computed transposed,
// St[j, i] = k_j . q_i, so that the per-query statistics (running max m, sum l) are lanes of a
// vector and the query tile is transposed once per task instead of a key tile per step.
template <class V, class T>
void forward_tiles(const AttentionProblem& p, const T* q, const T* k, const T* v, T* out,
                   float* lse) {
  using R = typename V::R;
  const int64_t B = p.batch, Tq = p.q_len, Tk = p.kv_len, Hq = p.q_heads, Hkv = p.kv_heads;
  const int64_t D = p.head_dim, Dp = pad16(D), G = Hq / Hkv;
  constexpr int64_t kBq = V::BQ, kBk = V::BK;
  const int64_t nqb = (Tq + kBq - 1) / kBq;
  const int64_t ntasks = B * Hq * nqb;
  const float qmul = p.scale * kLog2e;  // scores in log2 units: exp2 instead of exp
  const int64_t ldq = Hq * D;
  // Q is read once, by the task that transposes its tile into Qt, so it is read in place; K and
  // V are read by every query tile of their heads and are regrouped head-major.
  static thread_local Scratch kbuf, vbuf;
  float* const kdst = head_major_buffer(k, B, Tk, Hkv, D, kbuf);  // [B][Hkv][Tk][ldkv]
  float* const vdst = head_major_buffer(v, B, Tk, Hkv, D, vbuf);
  const float* kh = kdst ? kdst : as_f32(k);
  const float* vh = vdst ? vdst : as_f32(v);
  const int64_t ldkv = kdst ? row_ld(Dp) : Dp;  // row stride of kh and vh

  pack_heads(k, kdst, v, vdst, B, Tk, Hkv, D);
  parallel_for(ntasks, max_threads(), [&](int64_t task) {
    static thread_local Scratch tiles;
    float* Qt = tiles.get(Dp * kBq + kBk * kBq + kBq * Dp + 6 * kBq);  // [D][kBq], pre-scaled
    float* St = Qt + Dp * kBq;    // [kBk][kBq]
    float* O = St + kBk * kBq;    // [kBq][Dp]
    float* m = O + kBq * Dp;      // running max (log2 units)
    float* l = m + kBq;           // running sum
    float* alpha = l + kBq;       // per-step rescale of O
    float* tmax = alpha + kBq;    // the step's per-query max of the scores
    float* msub = tmax + kBq;     // the max subtracted before exp2 (0 where it is -inf)
    float* rsum = msub + kBq;     // the step's per-query sum of probabilities

    {
      // Causal tiles near the end of the sequence do the most work: hand them out first.
      const int64_t qb = p.causal ? nqb - 1 - task % nqb : task % nqb;
      const int64_t b = task / nqb / Hq, h = task / nqb % Hq, hk = h / G;
      const int64_t i0 = qb * kBq, mq = std::min(kBq, Tq - i0), mqp = pad16(mq);
      pack_cols(q + ((b * Tq + i0) * Hq + h) * D, ldq, mq, D, Qt, kBq, mqp, qmul);
      std::fill(O, O + mq * Dp, 0.0f);
      std::fill(m, m + kBq, -kInf);
      std::fill(l, l + kBq, 0.0f);
      const int64_t kend = p.causal ? std::min(Tk, i0 + mq) : Tk;
      for (int64_t j0 = 0; j0 < kend; j0 += kBk) {
        const int64_t nk = std::min(kBk, kend - j0);
        const float* Kr = kh + ((b * Hkv + hk) * Tk + j0) * ldkv;  // [nk][ldkv]
        const float* Vr = vh + ((b * Hkv + hk) * Tk + j0) * ldkv;  // [nk][ldkv]
        // The key and value tiles are not prefetched by hand: contiguous in the head-major
        // copies, the hardware prefetcher streams them, and prefetching the next step's tiles
        // during this step's GEMMs made the 144 x 144 forward 1-2% slower at T >= 1024 (more
        // than the L2's 512 KiB live at once on Zen 3). The last step's P V loads the output
        // rows the task writes next (cold, H * D elements apart) instead.
        Prefetch pv;
        if (j0 + kBk >= kend) {
          const int64_t row_lines = (D * int64_t(sizeof(T)) + 63) / 64;
          pv = {reinterpret_cast<const char*>(out + (b * Tq + i0) * ldq + h * D), mq * row_lines,
                row_lines, ldq * int64_t(sizeof(T))};
        }
        // The step's max comes out of the score GEMM unless masking rewrites scores after it.
        const bool masked = p.mask || (p.causal && j0 + nk - 1 > i0);
        std::fill(tmax, tmax + mqp, -kInf);
        // On the diagonal, micro-tiles of keys all after their queries stay unwritten (the
        // causal mask below sets them to -inf) and the PV sums stop at the last visible key.
        const bool diag = p.causal && j0 + nk - 1 > i0;
        const Causal qk_c{diag ? Causal::skip_rows_after_cols : Causal::none, i0 - j0};
        const Causal pv_c{diag ? Causal::k_end : Causal::none, i0 - j0};
        gemm<V>(nk, mqp, D, Kr, ldkv, 1, Qt, kBq, St, kBq, false, nullptr, masked ? nullptr : tmax,
                nullptr, qk_c);
        if (p.causal && j0 + nk - 1 > i0) {
          for (int64_t j = 0; j < nk; ++j) {
            const int64_t hide = std::min(mqp, j0 + j - i0);  // queries i < j0 + j - i0
            for (int64_t i = 0; i < hide; ++i) St[j * kBq + i] = -kInf;
          }
        }
        if (p.mask) {
          for (int64_t j = 0; j < nk; ++j) {
            for (int64_t i = 0; i < mq; ++i) {
              if (!mask_keep(p, b, h, i0 + i, j0 + j)) St[j * kBq + i] = -kInf;
            }
          }
        }
        // The softmax walks St row by row (one key, every query of the tile: contiguous), the
        // per-query statistics in small arrays. Walking a column of 8 queries down all keys
        // instead touched a new line of St per vector, 384 bytes apart, twelve times per step.
        if (masked) {
          for (int64_t j = 0; j < nk; ++j) {
            const float* s = St + j * kBq;
            for (int64_t i = 0; i < mqp; i += V::W) {
              V::store(tmax + i, V::max(V::load(tmax + i), V::load(s + i)));
            }
          }
        }
        for (int64_t i = 0; i < mqp; i += V::W) {
          const R mold = V::load(m + i);
          const R mnew = V::max(mold, V::load(tmax + i));
          V::store(m + i, mnew);
          // A row with nothing visible yet keeps m = -inf; subtracting 0 instead keeps every
          // exp2 argument -inf (-> 0) rather than NaN.
          for (int w = 0; w < V::W; ++w) msub[i + w] = m[i + w] == -kInf ? 0.0f : m[i + w];
          // Where the running max did not move the rescale is exactly 1: exp2(0) from the
          // polynomial is 1 + 2^-23, which would nudge O and l on every masked tile and make an
          // explicit causal mask differ from is_causal (which skips those tiles) in the last bit.
          float mo[V::W];
          V::store(mo, mold);
          V::store(alpha + i, V::exp2(V::sub(mold, V::load(msub + i))));
          for (int w = 0; w < V::W; ++w) {
            if (mo[w] == msub[i + w]) alpha[i + w] = 1.0f;
          }
          V::store(rsum + i, V::zero());
        }
        for (int64_t j = 0; j < nk; ++j) {
          float* s = St + j * kBq;
          for (int64_t i = 0; i < mqp; i += V::W) {
            const R pj = V::exp2(V::sub(V::load(s + i), V::load(msub + i)));
            V::store(s + i, pj);
            V::store(rsum + i, V::add(V::load(rsum + i), pj));
          }
        }
        for (int64_t i = 0; i < mqp; i += V::W) {
          V::store(l + i, V::fma(V::load(l + i), V::load(alpha + i), V::load(rsum + i)));
        }
        gemm<V>(mq, Dp, nk, St, 1, kBq, Vr, ldkv, O, Dp, true, alpha, nullptr, &pv, pv_c);
      }
      for (int64_t i = 0; i < mq; ++i) {
        // l == 0 only when every key is masked; a NaN l (NaN input) must stay visible.
        const float inv = l[i] == 0.0f ? 0.0f : 1.0f / l[i];
        T* o = out + (b * Tq + i0 + i) * ldq + h * D;
        for (int64_t d = 0; d < D; ++d) narrow(O[i * Dp + d] * inv, o + d);
        lse[(b * Hq + h) * Tq + i0 + i] = l[i] == 0.0f ? -kInf : (m[i] + std::log2(l[i])) * kLn2;
      }
    }
  });
  kbuf.trim();
  vbuf.trim();
}

// Backward (FlashAttention-2): one task per (batch, kv head, chunk of key tiles); each key tile
// keeps dK and dV in per-thread tiles while it sweeps the query tiles of every query head
// in its group. dQ accumulates head-major ([G][Tq][Dp], every query tile one contiguous
// block): in a per-thread buffer copied into `dq` at the end of the task when one chunk
// covers a kv head (no other task touches those rows), else in a per-chunk partial buffer
// summed afterwards. Accumulating in `dq` itself read and wrote rows H * D floats apart (4 KiB
// for H * D = 1024: every row of a micro-tile in the same L1 set), cold for every key tile.
template <class V, class T>
void backward_tiles(const AttentionProblem& p, const T* q, const T* k, const T* v, const T* out,
                    const T* dout, const float* lse, float* dq, float* dk, float* dv) {
  using R = typename V::R;
  const int64_t B = p.batch, Tq = p.q_len, Tk = p.kv_len, Hq = p.q_heads, Hkv = p.kv_heads;
  const int64_t D = p.head_dim, Dp = pad16(D), G = Hq / Hkv;
  const int64_t ldq = Hq * D, ldk = Hkv * D;
  constexpr int64_t kBq = V::BQ, kBk = V::BK;
  const int64_t nqb = (Tq + kBq - 1) / kBq, nkb = (Tk + kBk - 1) / kBk;
  const float c2 = p.scale * kLog2e;

  // delta[b, h, i] = dout_i . out_i, and lse in log2 units with -inf turned into +inf so a
  // fully masked row recomputes P = exp2(s - inf) = 0.
  // Q and dO are regrouped head-major first (see head_major_buffer).
  std::vector<float> delta(B * Hq * Tq), lse2(B * Hq * Tq);
  static thread_local Scratch qbuf, dobuf;
  float* const qdst = head_major_buffer(q, B, Tq, Hq, D, qbuf);  // [B][Hq][Tq][ldqh]
  float* const dodst = head_major_buffer(dout, B, Tq, Hq, D, dobuf);
  const float* qh = qdst ? qdst : as_f32(q);
  const float* doh = dodst ? dodst : as_f32(dout);
  const int64_t ldqh = qdst ? row_ld(Dp) : Dp;  // row stride of qh and doh
  const int64_t Lk = row_ld(Dp);                // row stride of the Kr, dK, dV tiles
  pack_heads(q, qdst, dout, dodst, B, Tq, Hq, D);
  const int64_t delta_per = 4096 / std::max<int64_t>(D, 1);  // rows per run
  parallel_for_runs(B * Hq * Tq, delta_per, max_threads(), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (Hq * Tq), h = r / Tq % Hq, i = r % Tq;
      const T* o = out + (b * Tq + i) * ldq + h * D;
      const T* g = dout + (b * Tq + i) * ldq + h * D;
      // Eight partial sums: one running sum is a chain of dependent adds the compiler may
      // not reorder (no -ffast-math), four cycles per element.
      float part[8] = {};
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) {
        for (int u = 0; u < 8; ++u) part[u] += widen(o[d + u]) * widen(g[d + u]);
      }
      float s = 0.0f;
      for (; d < D; ++d) s += widen(o[d]) * widen(g[d]);
      for (int u = 0; u < 8; ++u) s += part[u];
      delta[r] = s;
      lse2[r] = lse[r] == -kInf ? kInf : lse[r] * kLog2e;
    }
  });

  const int64_t nthreads = max_threads();
  const int64_t heads = B * Hkv;
  const int64_t nchunks = heads >= nthreads ? 1 : std::min(nkb, (nthreads + heads - 1) / heads);
  const int64_t ntasks = heads * nchunks;
  // Partial dQ of a chunk: [G][Tq][Dp].
  check_alloc("flash_attention_backward", double(nchunks > 1 ? ntasks * G * Tq * Dp : 0) * sizeof(float),
              "the partial dQ of every key chunk is that large; use fewer threads or a shorter sequence");
  std::vector<float> partial(nchunks > 1 ? ntasks * G * Tq * Dp : 0, 0.0f);
  static thread_local Scratch dqbuf;  // [G][Tq][Dp] of the task (nchunks == 1)

  parallel_for(ntasks, max_threads(), [&](int64_t task) {
    static thread_local Scratch tiles;
    float* Kr = tiles.get(3 * kBk * Lk + 2 * Dp * kBk + 2 * kBq * kBk);  // [kBk][Lk]
    float* dK = Kr + kBk * Lk;  // [kBk][Lk]
    float* dV = dK + kBk * Lk;  // [kBk][Lk]
    float* Kt = dV + kBk * Lk;  // [D][kBk]
    float* Vt = Kt + Dp * kBk;  // [D][kBk]
    float* S = Vt + Dp * kBk;   // [kBq][kBk], becomes P
    float* dP = S + kBq * kBk;  // [kBq][kBk], becomes dS
    float* const dqh = nchunks == 1 ? dqbuf.get(G * Tq * Dp) : nullptr;

    {
      const int64_t chunk = task % nchunks, b = task / nchunks / Hkv, hk = task / nchunks % Hkv;
      float* const dqt = nchunks > 1 ? partial.data() + task * G * Tq * Dp : dqh;
      if (dqh) std::fill(dqh, dqh + G * Tq * Dp, 0.0f);
      for (int64_t kb = chunk; kb < nkb; kb += nchunks) {
        const int64_t j0 = kb * kBk, nk = std::min(kBk, Tk - j0), nkp = pad16(nk);
        const T* kt = k + (b * Tk + j0) * ldk + hk * D;
        const T* vt = v + (b * Tk + j0) * ldk + hk * D;
        pack_rows(kt, ldk, nk, D, Kr, Lk);
        pack_cols(kt, ldk, nk, D, Kt, kBk, nkp);
        pack_cols(vt, ldk, nk, D, Vt, kBk, nkp);
        std::fill(dK, dK + nk * Lk, 0.0f);
        std::fill(dV, dV + nk * Lk, 0.0f);
        // Causal: query tiles before the one holding query j0 see none of these keys.
        const int64_t qb0 = p.causal ? std::min(nqb, j0 / kBq) : 0;
        for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
          for (int64_t qb = qb0; qb < nqb; ++qb) {
            const int64_t i0 = qb * kBq, mq = std::min(kBq, Tq - i0);
            float* const dQr = dqt + ((h - hk * G) * Tq + i0) * Dp;  // [mq][Dp]
            const float* Qr = qh + ((b * Hq + h) * Tq + i0) * ldqh;    // [mq][ldqh]
            const float* dOr = doh + ((b * Hq + h) * Tq + i0) * ldqh;  // [mq][ldqh]
            // On the diagonal: score micro-tiles of keys all after their queries are skipped
            // (zeroed below), and each product sums only the query/key pairs that see each other.
            const bool diag = p.causal && j0 + nk - 1 > i0;
            const Causal s_c{diag ? Causal::skip_cols_after_rows : Causal::none, i0 - j0};
            const Causal kv_c{diag ? Causal::k_begin : Causal::none, j0 - i0};
            const Causal q_c{diag ? Causal::k_end : Causal::none, i0 - j0};
            // The next query tile (of this head, else of the next head of the group) loads into
            // L2 during these two GEMMs.
            Prefetch pq, pdo;
            if (qb + 1 < nqb || h + 1 < (hk + 1) * G) {
              const int64_t next = qb + 1 < nqb ? (b * Hq + h) * Tq + i0 + kBq
                                                : (b * Hq + h + 1) * Tq + qb0 * kBq;
              const int64_t lines = std::min(kBq, Tq - (qb + 1 < nqb ? i0 + kBq : qb0 * kBq)) * ldqh / 16;
              pq = {reinterpret_cast<const char*>(qh + next * ldqh), lines};
              pdo = {reinterpret_cast<const char*>(doh + next * ldqh), lines};
            }
            gemm<V>(mq, nkp, D, Qr, ldqh, 1, Kt, kBk, S, kBk, false, nullptr, nullptr, &pq, s_c);
            gemm<V>(mq, nkp, D, dOr, ldqh, 1, Vt, kBk, dP, kBk, false, nullptr, nullptr, &pdo, s_c);
            const float* L = lse2.data() + (b * Hq + h) * Tq + i0;
            const float* De = delta.data() + (b * Hq + h) * Tq + i0;
            for (int64_t i = 0; i < mq; ++i) {
              float* s = S + i * kBk;
              float* dp = dP + i * kBk;
              const R c = V::set1(c2), li = V::set1(L[i]), di = V::set1(De[i]);
              const R sc = V::set1(p.scale);
              for (int64_t j = 0; j < nkp; j += V::W) {
                const R pj = V::exp2(V::sub(V::mul(V::load(s + j), c), li));
                V::store(s + j, pj);
                V::store(dp + j, V::mul(V::mul(pj, V::sub(V::load(dp + j), di)), sc));
              }
              int64_t limit = nk;
              if (p.causal) limit = std::max<int64_t>(0, std::min(limit, i0 + i - j0 + 1));
              for (int64_t j = limit; j < nkp; ++j) s[j] = dp[j] = 0.0f;
              if (p.mask) {
                for (int64_t j = 0; j < limit; ++j) {
                  if (!mask_keep(p, b, h, i0 + i, j0 + j)) s[j] = dp[j] = 0.0f;
                }
              }
            }
            // This query tile's dQ rows load into L2 during the two key-side GEMMs.
            Prefetch pdq{reinterpret_cast<const char*>(dQr), mq * Dp / 16};
            // After the key tile's last query tile its dK and dV rows are copied out: those
            // rows of dk and dv (cold, H * D floats apart) load during the last two GEMMs.
            Prefetch pdv, pdk;
            if (qb + 1 == nqb && h + 1 == (hk + 1) * G) {
              const int64_t row_lines = (D * int64_t(sizeof(float)) + 63) / 64;
              const int64_t r0 = (b * Tk + j0) * ldk + hk * D;
              pdv = {reinterpret_cast<const char*>(dv + r0), nk * row_lines, row_lines,
                     ldk * int64_t(sizeof(float))};
              pdk = {reinterpret_cast<const char*>(dk + r0), nk * row_lines, row_lines,
                     ldk * int64_t(sizeof(float))};
            }
            gemm<V>(nk, Dp, mq, S, 1, kBk, dOr, ldqh, dV, Lk, true, nullptr, nullptr, &pdq, kv_c);
            gemm<V>(nk, Dp, mq, dP, 1, kBk, Qr, ldqh, dK, Lk, true, nullptr, nullptr, &pdv, kv_c);
            gemm<V>(mq, Dp, nk, dP, kBk, 1, Kr, Lk, dQr, Dp, true, nullptr, nullptr, &pdk, q_c);
          }
        }
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t r = (b * Tk + j0 + j) * ldk + hk * D;
          std::memcpy(dk + r, dK + j * Lk, D * sizeof(float));
          std::memcpy(dv + r, dV + j * Lk, D * sizeof(float));
        }
      }
      if (dqh) {
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t i = 0; i < Tq; ++i) {
            std::memcpy(dq + (b * Tq + i) * ldq + (hk * G + g) * D, dqh + (g * Tq + i) * Dp,
                        D * sizeof(float));
          }
        }
      }
    }
    dqbuf.trim();
  });

  if (nchunks > 1) {
    parallel_for_runs(B * Tq * Hq, 4096 / (D * nchunks), max_threads(), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / (Tq * Hq), i = r / Hq % Tq, h = r % Hq, hk = h / G, g = h % G;
        float* d = dq + r * D;
        std::fill(d, d + D, 0.0f);
        for (int64_t c = 0; c < nchunks; ++c) {
          const float* s = partial.data() + (((b * Hkv + hk) * nchunks + c) * G + g) * Tq * Dp + i * Dp;
          for (int64_t x = 0; x < D; ++x) d[x] += s[x];
        }
      }
    });
  }
  qbuf.trim();
  dobuf.trim();
}

template <class V>
void forward_dispatch(const AttentionProblem& p, const void* q, const void* k, const void* v,
                      void* out, float* lse) {
  if (p.dtype == DType::float32) {
    forward_tiles<V>(p, static_cast<const float*>(q), static_cast<const float*>(k),
                     static_cast<const float*>(v), static_cast<float*>(out), lse);
  } else {
    forward_tiles<V>(p, static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                     static_cast<const uint16_t*>(v), static_cast<uint16_t*>(out), lse);
  }
}

template <class V>
void backward_dispatch(const AttentionProblem& p, const void* q, const void* k, const void* v,
                       const void* out, const void* dout, const float* lse, float* dq,
                       float* dk, float* dv) {
  if (p.dtype == DType::float32) {
    backward_tiles<V>(p, static_cast<const float*>(q), static_cast<const float*>(k),
                      static_cast<const float*>(v), static_cast<const float*>(out),
                      static_cast<const float*>(dout), lse, dq, dk, dv);
  } else {
    backward_tiles<V>(p, static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                      static_cast<const uint16_t*>(v), static_cast<const uint16_t*>(out),
                      static_cast<const uint16_t*>(dout), lse, dq, dk, dv);
  }
}

}  // namespace
}  // namespace shardlab::detail
