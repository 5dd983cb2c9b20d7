// Which instruction-set path the kernels take, read once from CPUID.
#pragma once

#include <string>

namespace shardlab {

// Ordered from lowest to highest: a path may be used when the CPU supports it and it is not
// above the ceiling set by the SHARDLAB_ISA environment variable.
enum class Isa { scalar = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3 };

// The best path this CPU supports (AVX2 means AVX2+FMA+F16C; AVX-512 means F, BW, VL, DQ).
Isa detected_isa();

// The path the kernels use: detected_isa() capped by SHARDLAB_ISA (scalar, avx2, avx512,
// avx512bf16), read once. An unknown SHARDLAB_ISA value throws std::invalid_argument.
Isa active_isa();

// Overrides the active path (tests use it to run every path on one machine). Throws
// std::invalid_argument if the CPU does not support `isa`.
void set_active_isa(Isa isa);

std::string isa_name(Isa isa);

// The clock (GHz) of the core this thread runs on, measured with a chain of dependent integer
// adds (one per cycle on every x86 core), turbo included. Benchmarks derive peaks from it.
double measure_clock_ghz();

// The fp32 FMA peak of the AVX2 path in GFLOP/s with `threads` OpenMP threads, measured (best
// of 5 runs of ~50 ms) by a loop of independent 256-bit FMAs on registers only: the ceiling
// for the AVX2 GEMM and attention kernels on this machine, turbo and sharing included.
// Throws std::runtime_error when the CPU has no AVX2+FMA, std::invalid_argument when
// threads < 1.
double measure_fma_peak_gflops(int threads);
Isa parse_isa(const std::string& name);

}  // namespace shardlab
