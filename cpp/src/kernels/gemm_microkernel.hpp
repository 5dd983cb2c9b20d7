// Kernel-internal interface between the GEMM driver (cpp/src/gemm.cpp) and the per-ISA files.
//
// Each ISA file returns a KernelSet: a register micro-kernel plus the packing routines that lay
// A and B out the way that micro-kernel reads them, and the cache blocking that suits it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "shardlab/gemm.hpp"

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

struct KernelSet {
  int mr = 0, nr = 0;
  int kpack = 1;        // k values interleaved per packed element group (2 for bf16 pairs)
  int elem_bytes = 4;   // bytes of one packed value
  int64_t mc = 0, kc = 0, nc = 0;  // cache blocking: A block in L2, B panel in L3
  PackA pack_a = nullptr;
  PackB pack_b = nullptr;
  MicroKernel kernel = nullptr;
};

KernelSet kernels_scalar(GemmType type);
KernelSet kernels_avx2(GemmType type);
KernelSet kernels_avx512(GemmType type);
KernelSet kernels_avx512bf16(GemmType type);

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

// fp32 panels: A panel is [k][MR], B panel is [k][NR]. `T` is the stored input type (float, or
// uint16_t bf16 widened here so the fp32 micro-kernels serve bf16 on CPUs without AVX512_BF16).
template <int MR, class T>
void pack_a_f32(const GemmOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, void* dst_) {
  float* dst = static_cast<float*>(dst_);
  const T* base = static_cast<const T*>(a.data);
  const int64_t rs = a.row_stride, cs = a.col_stride;
  for (int64_t i = 0; i < mc; i += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, mc - i));
    const T* src = base + (i0 + i) * rs + p0 * cs;
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
  for (int64_t j = 0; j < nc; j += NR) {
    const int cols = static_cast<int>(std::min<int64_t>(NR, nc - j));
    const T* src = base + p0 * rs + (j0 + j) * cs;
    if (cols == NR && cs == 1) {
      for (int64_t k = 0; k < kc; ++k)
        for (int c = 0; c < NR; ++c) dst[k * NR + c] = load_as_f32(src + k * rs + c);
    } else {
      if (cols < NR) std::fill(dst, dst + NR * kc, 0.0f);
      for (int c = 0; c < cols; ++c)
        for (int64_t k = 0; k < kc; ++k) dst[k * NR + c] = load_as_f32(src + k * rs + c * cs);
    }
    dst += NR * kc;
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
    if (rows < MR || kc % 2) std::fill(dst, dst + MR * 2 * kp, uint16_t{0});
    for (int r = 0; r < rows; ++r)
      for (int64_t k = 0; k < kc; ++k) dst[(k / 2 * MR + r) * 2 + k % 2] = src[r * rs + k * cs];
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
  for (int64_t j = 0; j < nc; j += NR) {
    const int cols = static_cast<int>(std::min<int64_t>(NR, nc - j));
    const uint16_t* src = base + p0 * rs + (j0 + j) * cs;
    if (cols == NR && cs == 1) {
      for (int64_t p = 0; p < kc / 2; ++p) {
        const uint16_t* r0 = src + 2 * p * rs;
        const uint16_t* r1 = r0 + rs;
        uint16_t* d = dst + p * NR * 2;
        for (int c = 0; c < NR; ++c) {
          d[2 * c] = r0[c];
          d[2 * c + 1] = r1[c];
        }
      }
      if (kc % 2) {
        const uint16_t* r0 = src + (kc - 1) * rs;
        uint16_t* d = dst + (kp - 1) * NR * 2;
        for (int c = 0; c < NR; ++c) {
          d[2 * c] = r0[c];
          d[2 * c + 1] = 0;
        }
      }
    } else {
      if (cols < NR || kc % 2) std::fill(dst, dst + NR * 2 * kp, uint16_t{0});
      for (int c = 0; c < cols; ++c)
        for (int64_t k = 0; k < kc; ++k) dst[(k / 2 * NR + c) * 2 + k % 2] = src[k * rs + c * cs];
    }
    dst += NR * 2 * kp;
  }
}

}  // namespace

}  // namespace shardlab::gemm_detail
