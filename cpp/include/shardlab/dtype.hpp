// Element types the core moves and reduces. bfloat16 is real 2-byte data (ml_dtypes layout).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace shardlab {

enum class DType { float32, float64, bfloat16, int32, int8, bool_ };

std::size_t itemsize(DType dtype);
std::string dtype_name(DType dtype);
// Accepts numpy's names ("float32", "bfloat16", "bool", ...); throws std::invalid_argument.
DType parse_dtype(const std::string& name);

// bfloat16 <-> float32 with round-to-nearest-even, NaN kept quiet (as ml_dtypes does).
inline float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

}  // namespace shardlab
