// Kernel-internal interface between the GEMM driver (cpp/src/gemm.cpp) and the per-ISA files.
//
// Each ISA file returns a KernelSet: a register micro-kernel plus the packing routines that lay
// A and B out the way that micro-kernel reads them, and the cache blocking that suits it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "shardlab/gemm.hpp"
#include "transpose8x8.hpp"

namespace shardlab::gemm_detail {

// Packs rows [i0, i0+mc) x cols [p0, p0+kc) of A into ceil(mc/mr) micro-panels, zero-padded.
using PackA = void (*)(const GemmOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                       void* dst);
// Packs rows [p0, p0+kc) x cols [j0, j0+nc) of B into ceil(nc/nr) micro-panels, zero-padded.
using PackB = void (*)(const GemmOperand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                       void* dst);
// Computes one full mr x nr tile from packed panels; C = tile, or C += tile if `accumulate`.
using MicroKernel = void (*)(int64_t kc, const void* a, const void* b, float* c, int64_t ldc,
                             bool accumulate);
// The same tile with A read in place from a row-major fp32 matrix: row r of the tile is
// a + r * lda, k contiguous (no packed A panel).
using MicroKernelRowsA = void (*)(int64_t kc, const float* a, int64_t lda, const void* b, float* c,
                                  int64_t ldc, bool accumulate);

struct KernelSet {
  int mr = 0, nr = 0;
  int kpack = 1;        // k values interleaved per packed element group (2 for bf16 pairs)
  int elem_bytes = 4;   // bytes of one packed value
  int64_t mc = 0, kc = 0, nc = 0;  // cache blocking: A block in L2, B panel in L3
  PackA pack_a = nullptr;
  PackB pack_b = nullptr;
  MicroKernel kernel = nullptr;
  MicroKernelRowsA kernel_rows_a = nullptr;  // fp32 only; nullptr where A is always packed
};

}  // namespace shardlab::gemm_detail

// The micro-kernels, packers and blocking of one ISA for `type` (dispatch.hpp): gemm.cpp
// (scalar), gemm_avx2.cpp, gemm_avx512.cpp, gemm_avx512bf16.cpp.
namespace shardlab::kernels {
namespace scalar { gemm_detail::KernelSet gemm_kernels(DType type); }
namespace avx2 { gemm_detail::KernelSet gemm_kernels(DType type); }
namespace avx512 { gemm_detail::KernelSet gemm_kernels(DType type); }
namespace avx512bf16 { gemm_detail::KernelSet gemm_kernels(DType type); }
}  // namespace shardlab::kernels

namespace shardlab::gemm_detail {

// The packing templates below are instantiated in every ISA file. They live in an anonymous
// namespace on purpose: with external linkage the linker would keep ONE instantiation, maybe
// the AVX-512 one, and the scalar path would then fault on a CPU without AVX-512.
namespace {

inline float load_as_f32(const float* p) { return *p; }
inline float load_as_f32(const uint16_t* p) {
  const uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX2__)
// Packs `rows` (<= MR <= 16) rows of 32-bit words, row i starting at src + i * row_bytes, into
// [word][MR] order, 8 words at a time through 8x8 transposes; rows past `rows` become zeros.
// Serves row-major fp32 A (a word is one k) and row-major bf16 A (a word is one k pair): the
// scalar loop costs ~2.5 cycles per element on its strided stores, this well under one.
template <int MR>
void pack_a_rows_32bit(const char* src, int64_t row_bytes, int rows, int64_t words, float* dst) {
  constexpr int kBlocks = (MR + 7) / 8;
  alignas(32) static const int kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= words; k += 8) {
    // The rows are cold (A streams from L3 or memory once per k block) and lie a row stride
    // apart: fetch a few lines ahead on each, or the loads below wait on every line.
    for (int r = 0; r < rows; ++r) _mm_prefetch(src + r * row_bytes + k * 4 + 256, _MM_HINT_T0);
    for (int blk = 0; blk < kBlocks; ++blk) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i) {
        const int r = blk * 8 + i;
        v[i] = r < rows ? _mm256_loadu_ps(reinterpret_cast<const float*>(src + r * row_bytes) + k)
                        : _mm256_setzero_ps();
      }
      transpose8x8(v);
      const int width = std::min(8, MR - blk * 8);
      const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - width));
      if constexpr (MR % 8 == 0) {
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (k + j) * MR + blk * 8, v[j]);
      } else if constexpr (MR < 8) {
        // One block of rows: each full-width store spills 8 - MR zeros into the start of the
        // next k's group, which the next store overwrites. Masked stores are microcoded on AMD
        // (about 12 cycles each on Zen 3: packing A took 8% of a 512^3 GEMM); only the last
        // group of the panel, whose spill would land past it, keeps one.
        for (int j = 0; j < 7; ++j) _mm256_storeu_ps(dst + (k + j) * MR, v[j]);
        if (k + 8 < words) {
          _mm256_storeu_ps(dst + (k + 7) * MR, v[7]);
        } else {
          _mm256_maskstore_ps(dst + (k + 7) * MR, mask, v[7]);
        }
      } else {
        for (int j = 0; j < 8; ++j) _mm256_maskstore_ps(dst + (k + j) * MR + blk * 8, mask, v[j]);
      }
    }
  }
  for (; k < words; ++k) {
    for (int r = 0; r < MR; ++r) {
      float w = 0.0f;
      if (r < rows) std::memcpy(&w, src + r * row_bytes + k * 4, 4);
      dst[k * MR + r] = w;
    }
  }
}
#endif

// Packs an operand whose panel direction is unit-stride: `src` row k (k < kc, `ld` elements
// apart) holds the values of panel slot 0, 1, ... contiguously, as a column-major A (slots are
// rows of A) or a row-major B (slots are columns of B). Writes floor(width / W) full panels
// [k][W] at dst, dst + W * kc, ... and returns how many slots they cover. Eight k at a time
// across all panels: each of the eight source rows is read as one sequential stream and each
// panel gets a few consecutive lines. Row by row, the stores of one k went to width / W panels
// W * kc * 4 bytes apart (16 KiB for B's kc = 256, 6 KiB for A's), a handful of L1 sets for
// all of them, and a miss on every store; panel by panel, each k read a new line of the source,
// and a 120-row A block touched 256 pages per panel (column-major A packed 2-3x slower than
// row-major: 6-8% of a 512^3 GEMM).
template <int W, class T>
int64_t pack_unit_stride_panels(const T* src, int64_t ld, int64_t kc, int64_t width, float* dst) {
  const int64_t full = width / W * W;
  for (int64_t k0 = 0; k0 < kc; k0 += 8) {
    const int64_t k1 = std::min(kc, k0 + 8);
    for (int64_t jj = 0; jj < full; jj += W) {
      for (int64_t k = k0; k < k1; ++k) {
        const T* s = src + k * ld + jj;
        float* d = dst + jj * kc + k * W;
        if constexpr (std::is_same_v<T, float>) {
          std::memcpy(d, s, W * sizeof(float));  // fixed size: a few vector moves
        } else {
          for (int c = 0; c < W; ++c) d[c] = load_as_f32(s + c);
        }
      }
    }
  }
  return full;
}

// fp32 panels: A panel is [k][MR], B panel is [k][NR]. `T` is the stored input type (float, or
// uint16_t bf16 widened here so the fp32 micro-kernels serve bf16 on CPUs without AVX512_BF16).
template <int MR, class T>
void pack_a_f32(const GemmOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, void* dst_) {
  float* dst = static_cast<float*>(dst_);
  const T* base = static_cast<const T*>(a.data);
  const int64_t rs = a.row_stride, cs = a.col_stride;
  int64_t i = 0;
  if (rs == 1 && cs != 1) {
    // Column-major A: each k holds MR consecutive rows, which is what a panel row is.
    i = pack_unit_stride_panels<MR>(base + i0 + p0 * cs, cs, kc, mc, dst);
    dst += i * kc;
  }
  for (; i < mc; i += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, mc - i));
    const T* src = base + (i0 + i) * rs + p0 * cs;
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float> && MR <= 16) {
      if (cs == 1) {
        pack_a_rows_32bit<MR>(reinterpret_cast<const char*>(src), rs * 4, rows, kc, dst);
        dst += MR * kc;
        continue;
      }
    }
#endif
    if (rows < MR) std::fill(dst, dst + MR * kc, 0.0f);
    // Walk the source along its unit-stride direction so the reads stream.
    if (cs == 1) {
      for (int r = 0; r < rows; ++r)
        for (int64_t k = 0; k < kc; ++k) dst[k * MR + r] = load_as_f32(src + r * rs + k);
    } else {
      for (int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < rows; ++r) dst[k * MR + r] = load_as_f32(src + r * rs + k * cs);
    }
    dst += MR * kc;
  }
}


template <int NR, class T>
void pack_b_f32(const GemmOperand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, void* dst_) {
  float* dst = static_cast<float*>(dst_);
  const T* base = static_cast<const T*>(b.data);
  const int64_t rs = b.row_stride, cs = b.col_stride;
  int64_t j = 0;
  if (cs == 1) {
    // Row-major B (pack B was 4% of a 512^3 GEMM when packed row by row; see the helper).
    j = pack_unit_stride_panels<NR>(base + p0 * rs + j0, rs, kc, nc, dst);
    dst += j * kc;
  }
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float> && NR % 8 == 0) {
    if (rs == 1 && cs != 1) {
      // Transposed B: column j of B is a contiguous run of k, like a row of a row-major A, so
      // the panel [k][NR] is NR such runs transposed 8 x 8 in registers. The scalar loop
      // below stored one float per (k, column) at a stride of NR floats (~2.5 cycles each).
      for (; j < nc; j += NR) {
        const int cols = static_cast<int>(std::min<int64_t>(NR, nc - j));
        pack_a_rows_32bit<NR>(reinterpret_cast<const char*>(base + p0 + (j0 + j) * cs), cs * 4, cols, kc,
                              dst);
        dst += NR * kc;
      }
      return;
    }
  }
#endif
  for (; j < nc; j += NR) {
    const int cols = static_cast<int>(std::min<int64_t>(NR, nc - j));
    const T* src = base + p0 * rs + (j0 + j) * cs;
    if (cols < NR) std::fill(dst, dst + NR * kc, 0.0f);
    for (int c = 0; c < cols; ++c)
      for (int64_t k = 0; k < kc; ++k) dst[k * NR + c] = load_as_f32(src + k * rs + c * cs);
    dst += NR * kc;
  }
}

// Packers for kernels that multiply in fp32: bf16 operands are widened while packing.
template <int MR, int NR>
void set_f32_packers(KernelSet& ks, DType type) {
  if (type == DType::float32) {
    ks.pack_a = pack_a_f32<MR, float>;
    ks.pack_b = pack_b_f32<NR, float>;
  } else {
    ks.pack_a = pack_a_f32<MR, uint16_t>;
    ks.pack_b = pack_b_f32<NR, uint16_t>;
  }
}

// bf16 pair panels for dot-product instructions (VDPBF16PS): k is grouped in pairs, each
// (row, pair) is one 32-bit word {x[2p], x[2p+1]}. A panel is [k/2][MR][2], B panel is
// [k/2][NR][2]; an odd kc is padded with a zero k.
template <int MR>
void pack_a_bf16_pairs(const GemmOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                       void* dst_) {
  uint16_t* dst = static_cast<uint16_t*>(dst_);
  const uint16_t* base = static_cast<const uint16_t*>(a.data);
  const int64_t rs = a.row_stride, cs = a.col_stride;
  const int64_t kp = (kc + 1) / 2;
  for (int64_t i = 0; i < mc; i += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, mc - i));
    const uint16_t* src = base + (i0 + i) * rs + p0 * cs;
#if defined(__AVX2__)
    if (cs == 1) {
      pack_a_rows_32bit<MR>(reinterpret_cast<const char*>(src), rs * 2, rows, kc / 2,
                            reinterpret_cast<float*>(dst));
      if (kc % 2) {
        uint16_t* last = dst + (kp - 1) * MR * 2;
        for (int r = 0; r < MR; ++r) {
          last[2 * r] = r < rows ? src[r * rs + kc - 1] : 0;
          last[2 * r + 1] = 0;
        }
      }
      dst += MR * 2 * kp;
      continue;
    }
#endif
    if (rows < MR || kc % 2) std::fill(dst, dst + MR * 2 * kp, uint16_t{0});
    if (rs == 1) {
      // A transposed: each k is a contiguous run over rows; interleave runs k and k + 1.
      for (int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < rows; ++r) dst[(k / 2 * MR + r) * 2 + k % 2] = src[r + k * cs];
    } else {
      for (int r = 0; r < rows; ++r)
        for (int64_t k = 0; k < kc; ++k) dst[(k / 2 * MR + r) * 2 + k % 2] = src[r * rs + k * cs];
    }
    dst += MR * 2 * kp;
  }
}

template <int NR>
void pack_b_bf16_pairs(const GemmOperand& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                       void* dst_) {
  uint16_t* dst = static_cast<uint16_t*>(dst_);
  const uint16_t* base = static_cast<const uint16_t*>(b.data);
  const int64_t rs = b.row_stride, cs = b.col_stride;
  const int64_t kp = (kc + 1) / 2;
  int64_t j = 0;
  if (cs == 1) {
    // Two rows at a time across all full panels, interleaved, so the reads stream.
    const int64_t full = nc / NR * NR;
    for (int64_t p = 0; p < kp; ++p) {
      const uint16_t* r0 = base + (p0 + 2 * p) * rs + j0;
      const uint16_t* r1 = r0 + rs;
      const bool odd_tail = 2 * p + 1 == kc;  // the zero k that pads an odd kc
      for (int64_t jj = 0; jj < full; jj += NR) {
        uint16_t* d = dst + jj * 2 * kp + p * NR * 2;
        for (int c = 0; c < NR; ++c) {
          d[2 * c] = r0[jj + c];
          d[2 * c + 1] = odd_tail ? 0 : r1[jj + c];
        }
      }
    }
    dst += full * 2 * kp;
    j = full;
  }
  for (; j < nc; j += NR) {
    const int cols = static_cast<int>(std::min<int64_t>(NR, nc - j));
    const uint16_t* src = base + p0 * rs + (j0 + j) * cs;
    if (cols < NR || kc % 2) std::fill(dst, dst + NR * 2 * kp, uint16_t{0});
    for (int c = 0; c < cols; ++c)
      for (int64_t k = 0; k < kc; ++k) dst[(k / 2 * NR + c) * 2 + k % 2] = src[k * rs + c * cs];
    dst += NR * 2 * kp;
  }
}

}  // namespace

}  // namespace shardlab::gemm_detail
