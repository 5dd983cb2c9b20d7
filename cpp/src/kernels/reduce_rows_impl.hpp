// kernels::<isa>::reduce_rows (reduce_rows.hpp), compiled once per ISA: reduce_rows.cpp,
// reduce_rows_avx2.cpp and reduce_rows_avx512.cpp define SHARDLAB_ISA_NS and include this file
// (dispatch.hpp). dst[i] = op over r of src[r][i] for one row of n elements.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shardlab/dtype.hpp"
#include "reduce_rows.hpp"
#include "shardlab/strided.hpp"

namespace shardlab::kernels::SHARDLAB_ISA_NS {
namespace {

template <class T> struct Acc { using type = T; };
template <> struct Acc<std::uint16_t> { using type = float; };
template <> struct Acc<std::int8_t> { using type = std::int32_t; };
template <> struct Acc<bool> { using type = std::int32_t; };

template <class T, class A>
inline A widen(T v) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    return bf16_to_float(v);
  } else {
    return static_cast<A>(v);
  }
}

template <class T, class A>
inline T narrow(A v) {
  if constexpr (std::is_same_v<T, std::uint16_t>) {
    return float_to_bf16(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
inline T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// acc[i] = f(acc[i], src[i]); the contiguous loop is separate so it vectorizes.
template <class T, class A, class F>
inline void apply(A* acc, const char* src, std::int64_t stride, std::int64_t n, F f) {
  if (stride == static_cast<std::int64_t>(sizeof(T))) {
    const T* t = reinterpret_cast<const T*>(src);
    for (std::int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], widen<T, A>(t[i]));
  } else {
    for (std::int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], widen<T, A>(load<T>(src + i * stride)));
  }
}

template <class T, class A>
void rows(ReduceOp op, const char* const* srcs, std::int64_t count, std::int64_t ss, char* dst,
          std::int64_t ds, std::int64_t n, void* scratch) {
  A* acc = static_cast<A*>(scratch);
  const auto first = [](A, A v) { return v; };
  apply<T, A>(acc, srcs[0], ss, n, first);
  std::int64_t r = 1;
  if (op == ReduceOp::sum || op == ReduceOp::mean) {
    if (ss == static_cast<std::int64_t>(sizeof(T))) {
      // Four sources per pass: a quarter of the accumulator traffic.
      for (; r + 4 <= count; r += 4) {
        const T* a = reinterpret_cast<const T*>(srcs[r]);
        const T* b = reinterpret_cast<const T*>(srcs[r + 1]);
        const T* c = reinterpret_cast<const T*>(srcs[r + 2]);
        const T* d = reinterpret_cast<const T*>(srcs[r + 3]);
        for (std::int64_t i = 0; i < n; ++i) {
          acc[i] = static_cast<A>(acc[i] + ((widen<T, A>(a[i]) + widen<T, A>(b[i])) +
                                            (widen<T, A>(c[i]) + widen<T, A>(d[i]))));
        }
      }
    }
    const auto add = [](A x, A v) { return static_cast<A>(x + v); };
    for (; r < count; ++r) apply<T, A>(acc, srcs[r], ss, n, add);
    if (op == ReduceOp::mean) {
      for (std::int64_t i = 0; i < n; ++i) acc[i] = static_cast<A>(acc[i] / static_cast<A>(count));
    }
  } else if (op == ReduceOp::max) {
    const auto mx = [](A x, A v) { return (v > x || v != v) ? v : x; };  // NaN propagates, as XLA
    for (; r < count; ++r) apply<T, A>(acc, srcs[r], ss, n, mx);
  } else {
    const auto mn = [](A x, A v) { return (v < x || v != v) ? v : x; };
    for (; r < count; ++r) apply<T, A>(acc, srcs[r], ss, n, mn);
  }
  if (ds == static_cast<std::int64_t>(sizeof(T))) {
    T* out = reinterpret_cast<T*>(dst);
    for (std::int64_t i = 0; i < n; ++i) out[i] = narrow<T, A>(acc[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      const T v = narrow<T, A>(acc[i]);
      std::memcpy(dst + i * ds, &v, sizeof v);
    }
  }
}

}  // namespace

void reduce_rows(DType dtype, ReduceOp op, const char* const* srcs, std::int64_t count, std::int64_t ss, char* dst,
                 std::int64_t ds, std::int64_t n, void* scratch) {
  switch (dtype) {
    case DType::float32: rows<float, float>(op, srcs, count, ss, dst, ds, n, scratch); break;
    case DType::float64: rows<double, double>(op, srcs, count, ss, dst, ds, n, scratch); break;
    case DType::bfloat16: rows<std::uint16_t, float>(op, srcs, count, ss, dst, ds, n, scratch); break;
    case DType::int32: rows<std::int32_t, std::int32_t>(op, srcs, count, ss, dst, ds, n, scratch); break;
    case DType::int8: rows<std::int8_t, std::int32_t>(op, srcs, count, ss, dst, ds, n, scratch); break;
    case DType::bool_: rows<bool, std::int32_t>(op, srcs, count, ss, dst, ds, n, scratch); break;
  }
}

}  // namespace shardlab::kernels::SHARDLAB_ISA_NS
