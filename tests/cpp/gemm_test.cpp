// Every GEMM path this CPU supports against gemm_reference on awkward sizes and layouts.
//
// Tolerance. Both kernels see the same inputs (bf16 inputs are exact in fp32, and a product of
// two bf16 values has at most 16 significant bits, so it is exact in fp32 too, including inside
// VDPBF16PS). What differs is only the fp32 accumulation of K terms against the reference's
// double sum, which is bounded by (K + 2) * 2^-24 * sum_q |a_iq| |b_qj| (K - 1 additions, the
// block-wise C += tile additions being among them, plus the final roundings). The tests check
// each element against that bound; a wrong index or a dropped k gives errors of order
// |a||b| = 2^24 / K times larger.
#include "shardlab/gemm.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include "shardlab/cpu_features.hpp"
#include "shardlab/dtype.hpp"

namespace shardlab {
namespace {

const std::vector<int64_t> kSizes = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 127, 129, 257};

// bfloat16 conversions: dtype.hpp's, the core's only ones (round to nearest even, as ml_dtypes).
uint16_t to_bf16(float f) { return float_to_bf16(f); }
float from_bf16(uint16_t h) { return bf16_to_float(h); }

// A buffer of random values with an element reader that hides the storage type.
struct Buffer {
  DType type;
  std::vector<float> f;
  std::vector<uint16_t> h;
  Buffer(DType t, size_t n, std::mt19937& rng) : type(t) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    if (t == DType::float32) {
      f.resize(n);
      for (auto& x : f) x = dist(rng);
    } else {
      h.resize(n);
      for (auto& x : h) x = to_bf16(dist(rng));
    }
  }
  const void* data() const { return type == DType::float32 ? (const void*)f.data() : (const void*)h.data(); }
  double at(int64_t i) const { return type == DType::float32 ? f[i] : from_bf16(h[i]); }
};

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16})
    if (static_cast<int>(isa) <= static_cast<int>(detected_isa())) out.push_back(isa);
  return out;
}

// Restores the active ISA and thread count when a test ends.
class GemmTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_isa_ = active_isa(), saved_threads_ = omp_get_max_threads(); }
  void TearDown() override {
    set_active_isa(saved_isa_);
    omp_set_num_threads(saved_threads_);
  }
  Isa saved_isa_{};
  int saved_threads_ = 1;
};

// Runs gemm and gemm_reference on `p` (whose c is ignored) and checks every element of every
// batch matrix against the accumulation bound.
void expect_matches_reference(GemmProblem p, const Buffer& a, int64_t a_base_elems,
                              const Buffer& b, int64_t b_base_elems, const std::string& what) {
  int64_t batch = 1;
  for (int64_t d : p.batch_shape) batch *= d;
  const int64_t m = p.a.rows, n = p.b.cols, k = p.a.cols;
  // C is contiguous: [batch..., m, n].
  p.c_row_stride = n;
  p.c_batch_strides.assign(p.batch_shape.size(), 0);
  int64_t stride = m * n;
  for (size_t d = p.batch_shape.size(); d-- > 0;) {
    p.c_batch_strides[d] = stride;
    stride *= p.batch_shape[d];
  }
  std::vector<float> got(static_cast<size_t>(batch * m * n), NAN), want(got.size(), NAN);
  p.c = got.data();
  gemm(p);
  p.c = want.data();
  gemm_reference(p);

  double worst = 0.0;
  for (int64_t t = 0; t < batch; ++t) {
    int64_t ao = a_base_elems, bo = b_base_elems, rem = t;
    for (size_t d = p.batch_shape.size(); d-- > 0;) {
      const int64_t i = rem % p.batch_shape[d];
      rem /= p.batch_shape[d];
      ao += i * p.a_batch_strides[d];
      bo += i * p.b_batch_strides[d];
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double mag = 0.0;
        for (int64_t q = 0; q < k; ++q)
          mag += std::fabs(a.at(ao + i * p.a.row_stride + q * p.a.col_stride) *
                           b.at(bo + q * p.b.row_stride + j * p.b.col_stride));
        const double tol = (k + 2) * std::ldexp(mag, -24) + 1e-30;
        const size_t idx = static_cast<size_t>((t * m + i) * n + j);
        const double err = std::fabs(static_cast<double>(got[idx]) - want[idx]);
        ASSERT_TRUE(err <= tol) << what << " batch " << t << " C[" << i << "," << j << "] = " << got[idx]
                                << ", reference " << want[idx] << ", tolerance " << tol;
        worst = std::max(worst, err / tol);
      }
    }
  }
  EXPECT_LE(worst, 1.0) << what;
}

GemmProblem plain(DType type, const Buffer& a, const Buffer& b, int64_t m, int64_t n, int64_t k,
                  bool a_trans, bool b_trans) {
  GemmProblem p;
  p.type = type;
  // A transposed: stored as k x m row-major, viewed as m x k with strides (1, m).
  p.a = {a.data(), m, k, a_trans ? 1 : k, a_trans ? m : 1};
  p.b = {b.data(), k, n, b_trans ? 1 : n, b_trans ? k : 1};
  return p;
}

std::string label(Isa isa, DType t, int64_t m, int64_t n, int64_t k) {
  return isa_name(isa) + (t == DType::float32 ? " f32 " : " bf16 ") + std::to_string(m) + "x" +
         std::to_string(n) + "x" + std::to_string(k);
}

TEST_F(GemmTest, RandomSizesEveryIsaBothDtypesAndTransposes) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<size_t> pick(0, kSizes.size() - 1);
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (DType type : {DType::float32, DType::bfloat16}) {
      for (int trial = 0; trial < 12; ++trial) {
        const int64_t m = kSizes[pick(rng)], n = kSizes[pick(rng)], k = kSizes[pick(rng)];
        const bool at = trial % 2, bt = (trial / 2) % 2;
        Buffer a(type, m * k, rng), b(type, k * n, rng);
        expect_matches_reference(plain(type, a, b, m, n, k, at, bt), a, 0, b, 0,
                                 label(isa, type, m, n, k) + (at ? " aT" : "") + (bt ? " bT" : ""));
      }
    }
  }
}

TEST_F(GemmTest, LargerThanOneCacheBlockInEveryDimension) {
  // N = 4200 crosses NC, and K = 1101 crosses KC (512 fp32, 1024 bf16) ending in an odd block,
  // so the C += tile accumulation, the jc loop and the zero k padding of bf16 pairs all run;
  // the second part crosses MC with a transposed A.
  std::mt19937 rng(7);
  const int64_t m = 9, n = 4200, k = 1101;
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (DType type : {DType::float32, DType::bfloat16}) {
      Buffer a(type, m * k, rng), b(type, k * n, rng);
      expect_matches_reference(plain(type, a, b, m, n, k, false, false), a, 0, b, 0,
                               label(isa, type, m, n, k));
    }
  }
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    Buffer a(DType::float32, 700 * 300, rng), b(DType::float32, 300 * 40, rng);
    expect_matches_reference(plain(DType::float32, a, b, 700, 40, 300, true, false), a, 0, b, 0,
                             label(isa, DType::float32, 700, 40, 300));
  }
}

TEST_F(GemmTest, StridedAndReversedViews) {
  // A is every other column of a wider matrix; B is read with negative strides (a view
  // reversed in both dims), as numpy's a[:, ::2] and b[::-1, ::-1] give.
  std::mt19937 rng(3);
  const int64_t m = 33, n = 17, k = 65;
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (DType type : {DType::float32, DType::bfloat16}) {
      Buffer a(type, m * 2 * k, rng), b(type, k * n, rng);
      GemmProblem p;
      p.type = type;
      const int64_t b_last = k * n - 1;
      p.a = {a.data(), m, k, 2 * k, 2};
      p.b = {static_cast<const char*>(b.data()) + b_last * (type == DType::float32 ? 4 : 2), k, n, -n, -1};
      expect_matches_reference(p, a, 0, b, b_last, label(isa, type, m, n, k) + " strided");
    }
  }
}

TEST_F(GemmTest, BatchedWithBroadcastDims) {
  // batch (3, 4): A varies along dim 0 only (stride 0 on dim 1), B along dim 1 only.
  std::mt19937 rng(11);
  const int64_t m = 9, n = 31, k = 17;
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      for (DType type : {DType::float32, DType::bfloat16}) {
        Buffer a(type, 3 * m * k, rng), b(type, 4 * k * n, rng);
        GemmProblem p = plain(type, a, b, m, n, k, false, true);
        p.a.col_stride = 1, p.a.row_stride = k;
        p.batch_shape = {3, 4};
        p.a_batch_strides = {m * k, 0};
        p.b_batch_strides = {0, k * n};
        expect_matches_reference(p, a, 0, b, 0,
                                 label(isa, type, m, n, k) + " batched, threads " + std::to_string(threads));
      }
    }
  }
}

TEST_F(GemmTest, ColumnMajorAAndTransposedBAcrossCacheBlocks) {
  // The packers that read a column-major A eight k at a time and a transposed B through 8 x 8
  // register transposes: M = 185 crosses MC (120 on AVX2, 168 on AVX-512) and ends in a part
  // micro-panel, K = 300 crosses the AVX2 KC and is not a multiple of 8 (the transposes' k
  // tail), N = 1060 crosses NC and ends in a 4-column panel; A is batched, B broadcast.
  std::mt19937 rng(13);
  const int64_t m = 185, n = 1060, k = 300;
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (DType type : {DType::float32, DType::bfloat16}) {
      omp_set_num_threads(type == DType::float32 ? 2 : 1);
      Buffer a(type, 2 * m * k, rng), b(type, k * n, rng);
      GemmProblem p = plain(type, a, b, m, n, k, true, true);
      p.batch_shape = {2};
      p.a_batch_strides = {m * k};
      p.b_batch_strides = {0};
      expect_matches_reference(p, a, 0, b, 0, label(isa, type, m, n, k) + " aT bT batched");
    }
  }
}

TEST_F(GemmTest, RowMajorAReadInPlaceForNarrowB) {
  // With N <= 8 micro-panels the AVX2 fp32 path reads a row-major A in place: A here is the
  // first k columns of a wider matrix (row stride k + 5), M = 250 crosses MC and ends in a part
  // micro-panel (packed), K = 300 crosses KC, and N = 120 ends in a part panel of B (whose A
  // micro-panels are packed one at a time) while N = 128 has none; batched, B broadcast.
  std::mt19937 rng(17);
  const int64_t m = 250, k = 300, lda = k + 5;
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (int64_t n : {120, 128}) {
      omp_set_num_threads(n == 120 ? 1 : 2);
      Buffer a(DType::float32, 2 * m * lda, rng), b(DType::float32, k * n, rng);
      GemmProblem p = plain(DType::float32, a, b, m, n, k, false, false);
      p.a.row_stride = lda;
      p.batch_shape = {2};
      p.a_batch_strides = {m * lda};
      p.b_batch_strides = {0};
      expect_matches_reference(p, a, 0, b, 0, label(isa, DType::float32, m, n, k) + " A in place");
    }
  }
}

TEST_F(GemmTest, ThreadCountDoesNotChangeTheResult) {
  // Splitting C across threads never changes the order of the k sum, so results are identical.
  std::mt19937 rng(5);
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (auto [m, n, k, batch] : std::vector<std::array<int64_t, 4>>{{257, 129, 300, 1}, {65, 300, 63, 3}}) {
      Buffer a(DType::float32, batch * m * k, rng), b(DType::float32, k * n, rng);
      GemmProblem p = plain(DType::float32, a, b, m, n, k, false, false);
      p.batch_shape = {batch};
      p.a_batch_strides = {m * k};
      p.b_batch_strides = {0};
      p.c_batch_strides = {m * n};
      p.c_row_stride = n;
      std::vector<float> one(static_cast<size_t>(batch * m * n)), two(one.size());
      omp_set_num_threads(1);
      p.c = one.data();
      gemm(p);
      omp_set_num_threads(2);
      p.c = two.data();
      gemm(p);
      EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float))) << isa_name(isa);
    }
  }
}

TEST_F(GemmTest, EmptyDimensions) {
  std::mt19937 rng(1);
  Buffer a(DType::float32, 12, rng), b(DType::float32, 12, rng);
  std::vector<float> c(16, NAN);
  GemmProblem p = plain(DType::float32, a, b, 4, 4, 0, false, false);
  p.c = c.data();
  p.c_row_stride = 4;
  gemm(p);  // K = 0: C is all zeros
  for (float x : c) EXPECT_EQ(x, 0.0f);
  std::fill(c.begin(), c.end(), NAN);
  p = plain(DType::float32, a, b, 0, 4, 3, false, false);
  p.c = c.data();
  p.c_row_stride = 4;
  gemm(p);  // M = 0: nothing written
  for (float x : c) EXPECT_TRUE(std::isnan(x));
}

TEST_F(GemmTest, ReferenceAndEveryPathMatchAnXtensorExpression) {
  // The definition as one xtensor expression, C[t, i, j] = sum_q A[t, i, q] B[q, j] in double,
  // B broadcast over the batch (stride 0): an oracle independent of gemm_reference's loops.
  xt::random::seed(13);
  const int64_t batch = 2, m = 13, n = 11, k = 29;
  const xt::xarray<float> af = xt::random::rand<float>({batch, m, k}, -1.0f, 1.0f);
  const xt::xarray<float> bf = xt::random::rand<float>({k, n}, -1.0f, 1.0f);
  for (DType type : {DType::float32, DType::bfloat16}) {
    // What the kernel reads: bf16 operands are rounded first, and the oracle sees the same values.
    xt::xarray<uint16_t> ah = xt::zeros<uint16_t>(af.shape()), bh = xt::zeros<uint16_t>(bf.shape());
    xt::xarray<double> ad = af, bd = bf;
    if (type == DType::bfloat16) {
      for (size_t i = 0; i < af.size(); ++i) ah.flat(i) = to_bf16(af.flat(i)), ad.flat(i) = from_bf16(ah.flat(i));
      for (size_t i = 0; i < bf.size(); ++i) bh.flat(i) = to_bf16(bf.flat(i)), bd.flat(i) = from_bf16(bh.flat(i));
    }
    const auto prod = xt::view(ad, xt::all(), xt::all(), xt::all(), xt::newaxis()) *
                      xt::view(bd, xt::newaxis(), xt::newaxis(), xt::all(), xt::all());
    const xt::xarray<double> want = xt::sum(prod, {2});
    const xt::xarray<double> tol = (k + 2) * std::ldexp(1.0, -24) * xt::sum(xt::abs(prod), {2}) + 1e-30;
    GemmProblem p;
    p.type = type;
    p.a = {type == DType::float32 ? (const void*)af.data() : (const void*)ah.data(), m, k, k, 1};
    p.b = {type == DType::float32 ? (const void*)bf.data() : (const void*)bh.data(), k, n, n, 1};
    p.c_row_stride = n;
    p.batch_shape = {batch};
    p.a_batch_strides = {m * k};
    p.b_batch_strides = {0};
    p.c_batch_strides = {m * n};
    xt::xarray<float> c = xt::zeros<float>({batch, m, n});
    p.c = c.data();
    gemm_reference(p);
    EXPECT_TRUE(xt::all(xt::abs(c - want) <= tol)) << "gemm_reference " << (type == DType::float32 ? "f32" : "bf16");
    for (Isa isa : supported_isas()) {
      set_active_isa(isa);
      c.fill(NAN);
      gemm(p);
      EXPECT_TRUE(xt::all(xt::abs(c - want) <= tol)) << label(isa, type, m, n, k) << " batched";
    }
  }
}

TEST_F(GemmTest, BadShapesThrow) {
  std::mt19937 rng(1);
  Buffer a(DType::float32, 12, rng), b(DType::float32, 30, rng);
  std::vector<float> c(30);
  GemmProblem p;
  p.a = {a.data(), 3, 4, 4, 1};
  p.b = {b.data(), 5, 6, 6, 1};
  p.c = c.data();
  p.c_row_stride = 6;
  try {
    gemm(p);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("inner dimensions 4 and 5 differ"), std::string::npos) << e.what();
  }
  p.b.rows = 4;
  p.batch_shape = {2};
  EXPECT_THROW(gemm(p), std::invalid_argument);  // batch strides missing
  p.batch_shape.clear();
  p.type = DType::float64;
  try {
    gemm(p);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[gemm] operands of dtype float64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlab

TEST(FmaPeak, MeasuresAPositiveRateAndRejectsBadThreadCounts) {
  EXPECT_THROW(shardlab::measure_fma_peak_gflops(0), std::invalid_argument);
  if (shardlab::detected_isa() < shardlab::Isa::avx2) {
    EXPECT_THROW(shardlab::measure_fma_peak_gflops(1), std::runtime_error);
    return;
  }
  const double one = shardlab::measure_fma_peak_gflops(1);
  EXPECT_TRUE(std::isfinite(one));
  EXPECT_GT(one, 0.0);
}
