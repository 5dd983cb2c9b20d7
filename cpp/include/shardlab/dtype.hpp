// Element types the core moves, reduces and multiplies: the one dtype enum of the core (the
// collectives, the GEMM and the attention kernels). bfloat16 is real 2-byte data (ml_dtypes
// layout), stored as std::uint16_t bit patterns; the conversions below are the only ones.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace shardlab {

enum class DType { float32, float64, bfloat16, int32, int8, bool_ };

// The DType of a C++ element type: dtype_of<float>::value == DType::float32. bfloat16 has no
// C++ type; its storage is std::uint16_t, which is not mapped (it could be any 16-bit data).
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::float64; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::int32; };
template <> struct dtype_of<std::int8_t> { static constexpr DType value = DType::int8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::bool_; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

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
