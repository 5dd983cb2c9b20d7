#include "shardlab/strided.hpp"

#include "kernels/dispatch.hpp"
#include "kernels/reduce_rows.hpp"
#include "shardlab/thread_pool.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace shardlab {

namespace {

// Below this many bytes a copy or reduction runs on the calling thread: waking a worker
// costs more than it saves (the per-collective overhead budget is ~20 us).
constexpr std::int64_t kParallelBytes = 1 << 18;

// Pieces of work per thread when parallel: enough that a thread the OS deschedules holds
// up little of a copy (the others take the rest, see thread_pool.hpp).
constexpr std::int64_t kPiecesPerThread = 8;

// body(w0, w1) for runs of [0, work): over the thread pool, up to kPiecesPerThread runs per
// thread, when `parallel`, else on the calling thread.
template <class Body>
void for_each_run(bool parallel, std::int64_t work, Body&& body) {
  const int threads = parallel ? max_threads() : 1;
  const std::int64_t runs = std::max<std::int64_t>(1, std::min(work, kPiecesPerThread * threads));
  parallel_for_runs(work, (work + runs - 1) / runs, threads, body);
}

// body(w) for w in [0, work), as for_each_run.
template <class Body>
void for_each_work(bool parallel, std::int64_t work, Body&& body) {
  for_each_run(parallel, work, [&](std::int64_t w0, std::int64_t w1) {
    for (std::int64_t w = w0; w < w1; ++w) body(w);
  });
}

// A loop nest over a shared shape with one stride list per operand, simplified by dropping
// size-1 dims and merging dims that are contiguous in every operand.
struct Nest {
  Shape shape;
  std::vector<Shape> strides;
};

Nest simplify(const Shape& shape, std::vector<Shape> strides) {
  Nest nest;
  nest.strides.resize(strides.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !nest.shape.empty();
    for (std::size_t k = 0; merge && k < strides.size(); ++k) {
      merge = nest.strides[k].back() == strides[k][d] * shape[d];
    }
    if (merge) {
      nest.shape.back() *= shape[d];
      for (std::size_t k = 0; k < strides.size(); ++k) nest.strides[k].back() = strides[k][d];
    } else {
      nest.shape.push_back(shape[d]);
      for (std::size_t k = 0; k < strides.size(); ++k) nest.strides[k].push_back(strides[k][d]);
    }
  }
  if (nest.shape.empty()) {  // a scalar: one element
    nest.shape.push_back(1);
    for (auto& s : nest.strides) s.push_back(0);
  }
  return nest;
}

// Byte offsets of outer index `flat` (row-major over shape[0..outer)) for each operand.
inline void outer_offsets(const Nest& nest, int outer, std::int64_t flat, std::int64_t* offs) {
  for (std::size_t k = 0; k < nest.strides.size(); ++k) offs[k] = 0;
  for (int d = outer - 1; d >= 0; --d) {
    const std::int64_t i = flat % nest.shape[d];
    flat /= nest.shape[d];
    for (std::size_t k = 0; k < nest.strides.size(); ++k) offs[k] += i * nest.strides[k][d];
  }
}

template <class Word>
void copy_run(char* dst, std::int64_t ds, const char* src, std::int64_t ss, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    Word w;
    std::memcpy(&w, src + i * ss, sizeof w);
    std::memcpy(dst + i * ds, &w, sizeof w);
  }
}

void copy_inner(char* dst, std::int64_t ds, const char* src, std::int64_t ss, std::int64_t n,
                std::size_t item) {
  if (ds == static_cast<std::int64_t>(item) && ss == ds) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * item);
    return;
  }
  switch (item) {
    case 1: copy_run<std::uint8_t>(dst, ds, src, ss, n); break;
    case 2: copy_run<std::uint16_t>(dst, ds, src, ss, n); break;
    case 4: copy_run<std::uint32_t>(dst, ds, src, ss, n); break;
    default: copy_run<std::uint64_t>(dst, ds, src, ss, n); break;
  }
}

void check_same_shape(const char* op, const ArrayRef& a, const ArrayRef& b) {
  if (a.shape != b.shape) {
    throw std::invalid_argument(std::string("[") + op + "] views have shapes " +
                                shape_str(a.shape) + " and " + shape_str(b.shape));
  }
  if (a.dtype != b.dtype) {
    throw std::invalid_argument(std::string("[") + op + "] views have dtypes " +
                                dtype_name(a.dtype) + " and " + dtype_name(b.dtype));
  }
}

}  // namespace

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

std::int64_t ArrayRef::size() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape, DType dtype) {
  Shape strides(shape.size());
  std::int64_t step = static_cast<std::int64_t>(itemsize(dtype));
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = step;
    step *= std::max<std::int64_t>(shape[d], 1);
  }
  return strides;
}

ArrayRef contiguous_ref(void* data, DType dtype, const Shape& shape) {
  return ArrayRef{data, dtype, shape, contiguous_strides(shape, dtype)};
}

Shape storage_shape(const Shape& mesh_shape, const std::vector<bool>& varying, const Shape& local) {
  Shape out;
  for (std::size_t i = 0; i < mesh_shape.size(); ++i) out.push_back(varying[i] ? mesh_shape[i] : 1);
  out.insert(out.end(), local.begin(), local.end());
  return out;
}

namespace {

// A transposing copy, tile by tile: dims `t` (unit stride in src) and the innermost (unit
// stride in dst) are walked in kTile x kTile blocks, so every cache line read from src and
// written to dst is used whole while it is in L1 (an element-at-a-time transpose reads a new
// line for every element).
constexpr std::int64_t kTile = 16;

template <class Word>
void copy_tile(char* dst, std::int64_t dst_t, const char* src, std::int64_t src_i, std::int64_t nt, std::int64_t ni) {
  for (std::int64_t i0 = 0; i0 < ni; i0 += kTile) {
    const std::int64_t i1 = std::min(ni, i0 + kTile);
    for (std::int64_t a = 0; a < nt; ++a) {
      Word* d = reinterpret_cast<Word*>(dst + a * dst_t);
      const char* sp = src + a * static_cast<std::int64_t>(sizeof(Word));
      for (std::int64_t i = i0; i < i1; ++i) std::memcpy(&d[i], sp + i * src_i, sizeof(Word));
    }
  }
}

// The transposed pair of dims of a copy, if any: an outer dim with unit source stride while
// the innermost dim has unit destination stride and a long source stride. -1 if none.
int transpose_dim(const Nest& nest, std::size_t item) {
  const int last = static_cast<int>(nest.shape.size()) - 1;
  const auto unit = static_cast<std::int64_t>(item);
  if (last < 1 || nest.strides[0][last] != unit || nest.strides[1][last] == unit || nest.shape[last] < kTile) {
    return -1;
  }
  for (int d = last - 1; d >= 0; --d) {
    if (nest.strides[1][d] == unit && nest.shape[d] >= kTile) return d;
  }
  return -1;
}

bool copy_transposed(const ArrayRef& dst, const ArrayRef& src, const Nest& nest, std::size_t item) {
  const int t = transpose_dim(nest, item);
  if (t < 0 || (item != 4 && item != 2 && item != 8)) return false;
  const int last = static_cast<int>(nest.shape.size()) - 1;
  // The other outer dims, walked by a flat index.
  Nest rest;
  rest.strides.resize(2);
  for (int d = 0; d < last; ++d) {
    if (d == t) continue;
    rest.shape.push_back(nest.shape[d]);
    for (int k = 0; k < 2; ++k) rest.strides[k].push_back(nest.strides[k][d]);
  }
  std::int64_t rest_count = 1;
  for (auto n : rest.shape) rest_count *= n;
  const std::int64_t nt = nest.shape[t], ni = nest.shape[last];
  const std::int64_t t_blocks = (nt + kTile - 1) / kTile;
  const std::int64_t dst_t = nest.strides[0][t], src_i = nest.strides[1][last];
  for_each_work(dst.nbytes() >= kParallelBytes, rest_count * t_blocks, [&](std::int64_t w) {
    std::int64_t offs[2] = {0, 0};
    outer_offsets(rest, static_cast<int>(rest.shape.size()), w / t_blocks, offs);
    const std::int64_t a0 = (w % t_blocks) * kTile, na = std::min(kTile, nt - a0);
    char* d = static_cast<char*>(dst.data) + offs[0] + a0 * dst_t;
    const char* sp = static_cast<const char*>(src.data) + offs[1] + a0 * static_cast<std::int64_t>(item);
    switch (item) {
      case 2: copy_tile<std::uint16_t>(d, dst_t, sp, src_i, na, ni); break;
      case 4: copy_tile<std::uint32_t>(d, dst_t, sp, src_i, na, ni); break;
      default: copy_tile<std::uint64_t>(d, dst_t, sp, src_i, na, ni); break;
    }
  });
  return true;
}

}  // namespace

void copy_strided(const ArrayRef& dst, const ArrayRef& src) {
  check_same_shape("copy", dst, src);
  if (dst.size() == 0) return;
  const std::size_t item = itemsize(dst.dtype);
  Nest nest = simplify(dst.shape, {dst.strides, src.strides});
  if (copy_transposed(dst, src, nest, item)) return;
  const int outer = static_cast<int>(nest.shape.size()) - 1;
  const std::int64_t inner = nest.shape.back();
  const std::int64_t ds = nest.strides[0].back(), ss = nest.strides[1].back();
  std::int64_t outer_count = 1;
  for (int d = 0; d < outer; ++d) outer_count *= nest.shape[d];
  // Split long inner runs so that one big contiguous copy also uses every thread.
  const std::int64_t wanted = kPiecesPerThread * max_threads();
  const bool parallel = dst.nbytes() >= kParallelBytes;
  std::int64_t pieces = 1;
  if (parallel && outer_count < wanted) pieces = (wanted + outer_count - 1) / outer_count;
  const std::int64_t piece = (inner + pieces - 1) / pieces;
  const std::int64_t work = outer_count * pieces;
  for_each_work(parallel, work, [&](std::int64_t w) {
    std::int64_t offs[2];
    outer_offsets(nest, outer, w / pieces, offs);
    const std::int64_t i0 = (w % pieces) * piece;
    const std::int64_t n = std::min(piece, inner - i0);
    if (n <= 0) return;
    copy_inner(static_cast<char*>(dst.data) + offs[0] + i0 * ds, ds,
               static_cast<const char*>(src.data) + offs[1] + i0 * ss, ss, n, item);
  });
}

void concatenate(const std::vector<ArrayRef>& srcs, int axis, const ArrayRef& dst) {
  if (axis < 0 || axis >= dst.ndim()) {
    throw std::invalid_argument("[concatenate] axis " + std::to_string(axis) + " is out of range for rank " +
                                std::to_string(dst.ndim()));
  }
  std::int64_t at = 0;
  for (const ArrayRef& src : srcs) {
    bool fits = src.ndim() == dst.ndim() && src.dtype == dst.dtype;
    for (int d = 0; fits && d < dst.ndim(); ++d) {
      fits = d == axis || src.shape[static_cast<std::size_t>(d)] == dst.shape[static_cast<std::size_t>(d)];
    }
    if (!fits) {
      throw std::invalid_argument("[concatenate] a piece of shape " + shape_str(src.shape) +
                                  " does not match the output " + shape_str(dst.shape) + " outside axis " +
                                  std::to_string(axis));
    }
    const std::int64_t n = src.shape[static_cast<std::size_t>(axis)];
    if (at + n > dst.shape[static_cast<std::size_t>(axis)]) {
      throw std::invalid_argument("[concatenate] the pieces are longer than the output's axis " + std::to_string(axis) +
                                  " of size " + std::to_string(dst.shape[static_cast<std::size_t>(axis)]));
    }
    ArrayRef part = dst;
    part.data = static_cast<char*>(dst.data) + at * dst.strides[static_cast<std::size_t>(axis)];
    part.shape[static_cast<std::size_t>(axis)] = n;
    copy_strided(part, src);
    at += n;
  }
  if (at != dst.shape[static_cast<std::size_t>(axis)]) {
    throw std::invalid_argument("[concatenate] the pieces fill " + std::to_string(at) + " of the output's axis " +
                                std::to_string(axis) + " of size " +
                                std::to_string(dst.shape[static_cast<std::size_t>(axis)]));
  }
}

namespace {

// Contiguous destination and condition; x and y either contiguous or one broadcast value.
template <class Word, bool XStep, bool YStep>
void select_dense(Word* dt, const std::uint8_t* ct, const Word* xt, const Word* yt, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const Word mask = static_cast<Word>(0) - static_cast<Word>(ct[i] != 0);
    dt[i] = (xt[XStep ? i : 0] & mask) | (yt[YStep ? i : 0] & ~mask);
  }
}

template <class Word>
void select_run(char* d, std::int64_t ds, const char* c, std::int64_t cs, const char* x, std::int64_t xs,
                const char* y, std::int64_t ys, std::int64_t n) {
  constexpr std::int64_t w = sizeof(Word);
  if (ds == w && cs == 1 && (xs == w || xs == 0) && (ys == w || ys == 0)) {
    auto* dt = reinterpret_cast<Word*>(d);
    const auto* ct = reinterpret_cast<const std::uint8_t*>(c);
    const auto* xt = reinterpret_cast<const Word*>(x);
    const auto* yt = reinterpret_cast<const Word*>(y);
    if (xs && ys) {
      select_dense<Word, true, true>(dt, ct, xt, yt, n);
    } else if (xs) {
      select_dense<Word, true, false>(dt, ct, xt, yt, n);
    } else if (ys) {
      select_dense<Word, false, true>(dt, ct, xt, yt, n);
    } else {
      select_dense<Word, false, false>(dt, ct, xt, yt, n);
    }
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const bool take = c[i * cs] != 0;
    std::memcpy(d + i * ds, (take ? x + i * xs : y + i * ys), sizeof(Word));
  }
}

}  // namespace

void select_strided(const ArrayRef& dst, const ArrayRef& cond, const ArrayRef& x, const ArrayRef& y) {
  check_same_shape("where", dst, x);
  check_same_shape("where", dst, y);
  if (cond.shape != dst.shape || cond.dtype != DType::bool_) {
    throw std::invalid_argument("[where] the condition must be bool with shape " + shape_str(dst.shape));
  }
  if (dst.size() == 0) return;
  const std::size_t item = itemsize(dst.dtype);
  Nest nest = simplify(dst.shape, {dst.strides, cond.strides, x.strides, y.strides});
  const int outer = static_cast<int>(nest.shape.size()) - 1;
  const std::int64_t inner = nest.shape.back();
  std::int64_t outer_count = 1;
  for (int d = 0; d < outer; ++d) outer_count *= nest.shape[d];
  const bool parallel = dst.nbytes() >= kParallelBytes;
  for_each_work(parallel, outer_count, [&](std::int64_t w) {
    std::int64_t o[4];
    outer_offsets(nest, outer, w, o);
    char* d = static_cast<char*>(dst.data) + o[0];
    const char* c = static_cast<const char*>(cond.data) + o[1];
    const char* xp = static_cast<const char*>(x.data) + o[2];
    const char* yp = static_cast<const char*>(y.data) + o[3];
    const std::int64_t ds = nest.strides[0].back(), cs = nest.strides[1].back();
    const std::int64_t xs = nest.strides[2].back(), ys = nest.strides[3].back();
    switch (item) {
      case 1: select_run<std::uint8_t>(d, ds, c, cs, xp, xs, yp, ys, inner); break;
      case 2: select_run<std::uint16_t>(d, ds, c, cs, xp, xs, yp, ys, inner); break;
      case 4: select_run<std::uint32_t>(d, ds, c, cs, xp, xs, yp, ys, inner); break;
      default: select_run<std::uint64_t>(d, ds, c, cs, xp, xs, yp, ys, inner); break;
    }
  });
}

void fill_zero(const ArrayRef& dst) {
  if (dst.size() == 0) return;
  const std::size_t item = itemsize(dst.dtype);
  Nest nest = simplify(dst.shape, {dst.strides});
  const int outer = static_cast<int>(nest.shape.size()) - 1;
  const std::int64_t inner = nest.shape.back(), ds = nest.strides[0].back();
  std::int64_t outer_count = 1;
  for (int d = 0; d < outer; ++d) outer_count *= nest.shape[d];
  for (std::int64_t w = 0; w < outer_count; ++w) {
    std::int64_t off;
    outer_offsets(nest, outer, w, &off);
    char* d = static_cast<char*>(dst.data) + off;
    if (ds == static_cast<std::int64_t>(item)) {
      std::memset(d, 0, static_cast<std::size_t>(inner) * item);
    } else {
      for (std::int64_t i = 0; i < inner; ++i) std::memset(d + i * ds, 0, item);
    }
  }
}

void reduce_strided(const ArrayRef& dst, const ArrayRef& src, int reduce_dims, ReduceOp op) {
  if (src.ndim() != dst.ndim() + reduce_dims ||
      !std::equal(dst.shape.begin(), dst.shape.end(), src.shape.begin())) {
    throw std::invalid_argument("[reduce] source shape " + shape_str(src.shape) +
                                " is not the destination shape " + shape_str(dst.shape) +
                                " followed by " + std::to_string(reduce_dims) + " reduced dims");
  }
  if (dst.dtype != src.dtype) throw std::invalid_argument("[reduce] dtypes differ");
  (void)reduce_dims;
  if (dst.size() == 0) return;
  const int out_dims = dst.ndim();
  // One nest over the output dims with strides (dst, src); reduction dims iterated inside.
  Nest nest = simplify(dst.shape, {dst.strides, Shape(src.strides.begin(), src.strides.begin() + out_dims)});
  const Shape red_shape(src.shape.begin() + out_dims, src.shape.end());
  const Shape red_strides(src.strides.begin() + out_dims, src.strides.end());
  std::int64_t red_count = 1;
  for (auto s : red_shape) red_count *= s;
  if (red_count == 0) throw std::invalid_argument("[reduce] empty reduction");
  std::vector<std::int64_t> red_offsets(static_cast<std::size_t>(red_count));
  for (std::int64_t r = 0; r < red_count; ++r) {
    std::int64_t off = 0, rr = r;
    for (int k = static_cast<int>(red_shape.size()) - 1; k >= 0; --k) {
      off += (rr % red_shape[k]) * red_strides[k];
      rr /= red_shape[k];
    }
    red_offsets[r] = off;
  }

  const int outer = static_cast<int>(nest.shape.size()) - 1;
  const std::int64_t inner = nest.shape.back();
  const std::int64_t dsi = nest.strides[0].back(), ssi = nest.strides[1].back();
  std::int64_t outer_count = 1;
  for (int d = 0; d < outer; ++d) outer_count *= nest.shape[d];
  // Rows short enough that the accumulator stays in L1 while the sources stream through.
  const std::int64_t chunk = std::min<std::int64_t>(inner, 2048);
  const std::int64_t chunks = (inner + chunk - 1) / chunk;
  const std::int64_t work = outer_count * chunks;
  const bool parallel = src.nbytes() >= kParallelBytes && work > 1;
  const auto rows = SHARDLAB_KERNEL(reduce_rows);

  // One scratch row (8 bytes per element covers every accumulator) and source list per run.
  auto run_range = [&](std::int64_t w0, std::int64_t w1) {
    std::vector<double> scratch(static_cast<std::size_t>(chunk));
    std::vector<const char*> srcs(static_cast<std::size_t>(red_count));
    for (std::int64_t w = w0; w < w1; ++w) {
      std::int64_t offs[2];
      outer_offsets(nest, outer, w / chunks, offs);
      const std::int64_t c0 = (w % chunks) * chunk;
      const char* base = static_cast<const char*>(src.data) + offs[1] + c0 * ssi;
      for (std::int64_t r = 0; r < red_count; ++r) srcs[r] = base + red_offsets[r];
      rows(dst.dtype, op, srcs.data(), red_count, ssi, static_cast<char*>(dst.data) + offs[0] + c0 * dsi, dsi,
           std::min(chunk, inner - c0), scratch.data());
    }
  };
  for_each_run(parallel, work, run_range);
}

}  // namespace shardlab
