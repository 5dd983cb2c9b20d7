// AVX512_BF16 micro-kernel: an MR x 32 fp32 tile of C accumulated with VDPBF16PS, which
// multiplies bf16 pairs exactly and adds them to fp32 lanes. Each step consumes a pair of k,
// so A and B are packed as 32-bit {x[2p], x[2p+1]} words (see pack_*_bf16_pairs).
//
// VDPBF16PS has 6-cycle latency and two ports on Zen 5, so 12 accumulators just cover it; the
// 16 of an 8 x 32 tile measured ~8% faster there than 24 (12 x 32) or 28 (14 x 32).
#include <immintrin.h>

#include "gemm_microkernel.hpp"

namespace shardlab::gemm_detail {
namespace {

constexpr int kMr = 8;
constexpr int kNr = 32;

template <int MR>
void kernel_bf16(int64_t kc, const void* a_, const void* b_, float* c, int64_t ldc,
                 bool accumulate) {
  const uint32_t* a = static_cast<const uint32_t*>(a_);  // one bf16 pair per word
  const uint32_t* b = static_cast<const uint32_t*>(b_);
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    acc0[r] = acc1[r] = _mm512_setzero_ps();
    // C rows are far apart; fetching them now hides the misses behind the k loop.
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
  }
  const int64_t pairs = (kc + 1) / 2;
#pragma GCC unroll 2
  for (int64_t p = 0; p < pairs; ++p) {
    // The A micro-panel streams from L2; the B one stays in L1.
    _mm_prefetch(reinterpret_cast<const char*>(a + 8 * MR), _MM_HINT_T0);
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], ar, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], ar, b1);
    }
    a += MR;
    b += kNr;
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if (accumulate) {
      acc0[r] = _mm512_add_ps(acc0[r], _mm512_loadu_ps(cr));
      acc1[r] = _mm512_add_ps(acc1[r], _mm512_loadu_ps(cr + 16));
    }
    _mm512_storeu_ps(cr, acc0[r]);
    _mm512_storeu_ps(cr + 16, acc1[r]);
  }
}

}  // namespace

}  // namespace shardlab::gemm_detail

namespace shardlab::kernels::avx512bf16 {

using namespace gemm_detail;

KernelSet gemm_kernels(DType type) {
  if (type == DType::float32) return avx512::gemm_kernels(type);
  KernelSet ks;
  ks.mr = kMr;
  ks.nr = kNr;
  ks.kpack = 2;
  ks.elem_bytes = 2;
  ks.mc = 8 * 21;
  ks.kc = 1024;
  ks.nc = 1024;
  ks.kernel = kernel_bf16<kMr>;
  ks.pack_a = pack_a_bf16_pairs<kMr>;
  ks.pack_b = pack_b_bf16_pairs<kNr>;
  return ks;
}

}  // namespace shardlab::kernels::avx512bf16
