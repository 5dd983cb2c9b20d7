#include "shardlab/cpu_features.hpp"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace shardlab {
namespace kernels::avx2 {
double fma_peak_gflops(int threads, int64_t iters);  // kernels/fma_peak_avx2.cpp
}  // namespace kernels::avx2

namespace {

bool os_saves_zmm() {
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xE6) == 0xE6;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM state enabled
}

bool os_saves_ymm() {
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6) == 0x6;
}

Isa probe() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return Isa::scalar;
  const bool osxsave = c & bit_OSXSAVE;
  const bool fma = c & bit_FMA, f16c = c & bit_F16C, avx = c & bit_AVX;
  if (!osxsave || !avx || !os_saves_ymm()) return Isa::scalar;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Isa::scalar;
  const bool avx2 = b & bit_AVX2;
  if (!(avx2 && fma && f16c)) return Isa::scalar;
  const bool avx512 = (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) &&
                      (b & bit_AVX512DQ) && os_saves_zmm();
  if (!avx512) return Isa::avx2;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
  const bool bf16 = a1 & (1u << 5);  // CPUID.(EAX=7,ECX=1):EAX[5] = AVX512_BF16
  return bf16 ? Isa::avx512bf16 : Isa::avx512;
}

Isa initial_active() {
  const Isa best = detected_isa();
  const char* env = std::getenv("SHARDLAB_ISA");
  if (env == nullptr || *env == '\0') return best;
  const Isa cap = parse_isa(env);
  return static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_active())};
  return slot;
}

}  // namespace

Isa detected_isa() {
  static const Isa isa = probe();
  return isa;
}

Isa active_isa() { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa())) {
    throw std::invalid_argument("[set_active_isa] this CPU supports up to '" +
                                isa_name(detected_isa()) + "', not '" + isa_name(isa) + "'");
  }
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

double measure_clock_ghz() {
  constexpr long kIters = 10'000'000;  // x 16 adds: ~40 ms at 4 GHz
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    uint64_t x = 1, n = kIters;
    const auto t0 = std::chrono::steady_clock::now();
    __asm__ volatile(
        "1:\n\t"
        "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
        "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
        "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
        "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
        "dec %1\n\tjnz 1b"
        : "+r"(x), "+r"(n)
        :
        : "cc");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 16.0 * kIters / s / 1e9);  // the fastest run saw the least preemption
  }
  return best;
}

double measure_fma_peak_gflops(int threads) {
  if (threads < 1) {
    throw std::invalid_argument("[measure_fma_peak_gflops] threads " + std::to_string(threads) +
                                " is not positive; pass the thread count the kernels use");
  }
  if (detected_isa() < Isa::avx2) {
    throw std::runtime_error("[measure_fma_peak_gflops] this CPU has no AVX2+FMA, so there is "
                             "no AVX2 peak to measure");
  }
  // Calibrate to ~50 ms per run, then keep the best of 5: preemption only ever lowers it.
  int64_t iters = 1 << 16;
  double gflops = kernels::avx2::fma_peak_gflops(threads, iters);
  iters = std::max<int64_t>(iters, static_cast<int64_t>(0.05 * gflops * 1e9 / (2.0 * 8 * 12 * threads)));
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) best = std::max(best, kernels::avx2::fma_peak_gflops(threads, iters));
  return best;
}

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
  }
  return "unknown";
}

Isa parse_isa(const std::string& name) {
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16}) {
    if (isa_name(isa) == name) return isa;
  }
  throw std::invalid_argument("[SHARDLAB_ISA] unknown instruction set '" + name +
                              "'; use one of scalar, avx2, avx512, avx512bf16");
}

}  // namespace shardlab
