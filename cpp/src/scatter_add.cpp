// Row scatter-add, parallel over destination rows.
#include "shardlab/scatter_add.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "shardlab/thread_pool.hpp"

namespace shardlab {
namespace {

std::int64_t index_at(const ArrayRef& index, std::int64_t p, std::int64_t n) {
  const char* at = static_cast<const char*>(index.data) + p * index.strides[0] + n * index.strides[1];
  std::int32_t v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

void check(const ArrayRef& dst, const ArrayRef& index, const ArrayRef& src) {
  const std::string op = "[scatter_add_rows] ";
  if (dst.ndim() != 3 || index.ndim() != 2 || src.ndim() != 3) {
    throw std::invalid_argument(op + "expects dst [P, R, C], index [P, N] and src [P, N, C]; got " +
                                shape_str(dst.shape) + ", " + shape_str(index.shape) + ", " +
                                shape_str(src.shape));
  }
  if (index.shape[0] != dst.shape[0] || src.shape[0] != dst.shape[0] || src.shape[1] != index.shape[1] ||
      src.shape[2] != dst.shape[2]) {
    throw std::invalid_argument(op + "shapes do not agree: dst " + shape_str(dst.shape) + ", index " +
                                shape_str(index.shape) + ", src " + shape_str(src.shape));
  }
  if (dst.dtype != src.dtype || (dst.dtype != DType::float32 && dst.dtype != DType::float64)) {
    throw std::invalid_argument(op + "dst and src must both be float32 or both float64; got " +
                                dtype_name(dst.dtype) + " and " + dtype_name(src.dtype));
  }
  if (index.dtype != DType::int32) {
    throw std::invalid_argument(op + "index must be int32; got " + dtype_name(index.dtype));
  }
  if (dst.strides != contiguous_strides(dst.shape, dst.dtype)) {
    throw std::invalid_argument(op + "dst must be contiguous");
  }
  const std::int64_t rows = dst.shape[1];
  for (std::int64_t p = 0; p < index.shape[0]; ++p) {
    for (std::int64_t n = 0; n < index.shape[1]; ++n) {
      const std::int64_t r = index_at(index, p, n);
      if (r < 0 || r >= rows) {
        throw std::out_of_range(op + "index " + std::to_string(r) + " at position (" + std::to_string(p) + ", " +
                                std::to_string(n) + ") is outside the " + std::to_string(rows) + " rows");
      }
    }
  }
}

template <class T>
void add_row(T* out, const char* src, std::int64_t stride, std::int64_t cols) {
  if (stride == static_cast<std::int64_t>(sizeof(T))) {
    const T* s = reinterpret_cast<const T*>(src);
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) out[c] += s[c];
    return;
  }
  for (std::int64_t c = 0; c < cols; ++c) out[c] += *reinterpret_cast<const T*>(src + c * stride);
}

template <class T>
void run(const ArrayRef& dst, const ArrayRef& index, const ArrayRef& src) {
  const std::int64_t P = dst.shape[0], R = dst.shape[1], C = dst.shape[2], N = index.shape[1];
  T* out = static_cast<T*>(dst.data);
  const char* in = static_cast<const char*>(src.data);
  // Each band of destination rows (of every p) is one piece of work that scans all N indices:
  // no two pieces touch one row, and a row's additions happen in the order of n. Four bands per
  // thread, so a descheduled thread holds up a quarter of its share (thread_pool.hpp).
  const int threads = P * N * C >= (1 << 16) ? max_threads() : 1;
  const std::int64_t bands = std::min<std::int64_t>(R, 4 * threads);
  parallel_for(bands, threads, [&](std::int64_t band) {
    const std::int64_t lo = R * band / bands, hi = R * (band + 1) / bands;
    for (std::int64_t p = 0; p < P; ++p) {
      for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t r = index_at(index, p, n);
        if (r < lo || r >= hi) continue;
        add_row(out + (p * R + r) * C, in + p * src.strides[0] + n * src.strides[1], src.strides[2], C);
      }
    }
  });
}

}  // namespace

void scatter_add_rows(const ArrayRef& dst, const ArrayRef& index, const ArrayRef& src) {
  check(dst, index, src);
  if (dst.dtype == DType::float32) {
    run<float>(dst, index, src);
  } else {
    run<double>(dst, index, src);
  }
}

void scatter_add_rows_reference(const ArrayRef& dst, const ArrayRef& index, const ArrayRef& src) {
  check(dst, index, src);
  for (std::int64_t p = 0; p < src.shape[0]; ++p) {
    for (std::int64_t n = 0; n < src.shape[1]; ++n) {
      const std::int64_t r = index_at(index, p, n);
      for (std::int64_t c = 0; c < src.shape[2]; ++c) {
        const char* s = static_cast<const char*>(src.data) + p * src.strides[0] + n * src.strides[1] +
                        c * src.strides[2];
        char* d = static_cast<char*>(dst.data) + p * dst.strides[0] + r * dst.strides[1] + c * dst.strides[2];
        if (dst.dtype == DType::float32) {
          *reinterpret_cast<float*>(d) += *reinterpret_cast<const float*>(s);
        } else {
          *reinterpret_cast<double*>(d) += *reinterpret_cast<const double*>(s);
        }
      }
    }
  }
}

}  // namespace shardlab
