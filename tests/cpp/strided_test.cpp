#include "shardlab/strided.hpp"

#include "shardlab/cpu_features.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>
#include <random>
#include <xtensor/xarray.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

using namespace shardlab;

namespace {

template <class T>
ArrayRef ref_of(xt::xarray<T>& a, DType dtype) {
  Shape shape(a.shape().begin(), a.shape().end());
  return contiguous_ref(a.data(), dtype, shape);
}

}  // namespace

TEST(Strided, CopyTransposedViewMatchesXtensor) {
  xt::random::seed(1);
  xt::xarray<float> src = xt::random::rand<float>({5, 7, 3});
  xt::xarray<float> dst = xt::zeros<float>({3, 5, 7});
  ArrayRef s = ref_of(src, DType::float32);
  // view src as (3, 5, 7) by permuting its strides
  ArrayRef sv{s.data, s.dtype, {3, 5, 7}, {s.strides[2], s.strides[0], s.strides[1]}};
  copy_strided(ref_of(dst, DType::float32), sv);
  xt::xarray<float> want = xt::transpose(src, {2, 0, 1});
  EXPECT_EQ(dst, want);
}

TEST(Strided, CopyBroadcastsZeroStrides) {
  xt::xarray<std::int32_t> src = {1, 2, 3};
  xt::xarray<std::int32_t> dst = xt::zeros<std::int32_t>({4, 3});
  ArrayRef s = ref_of(src, DType::int32);
  copy_strided(ref_of(dst, DType::int32), ArrayRef{s.data, s.dtype, {4, 3}, {0, 4}});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(xt::xarray<std::int32_t>(xt::row(dst, i)), src);
}

TEST(Strided, LargeCopyIsExactInParallel) {
  xt::xarray<double> src = xt::random::randn<double>({1 << 16, 9});
  xt::xarray<double> dst = xt::zeros<double>({1 << 16, 9});
  copy_strided(ref_of(dst, DType::float64), ref_of(src, DType::float64));
  EXPECT_EQ(dst, src);
}

TEST(Strided, ConcatenateMatchesXtensorWithTransposedAndBroadcastPieces) {
  xt::random::seed(4);
  for (std::size_t rows : {1, 3, 700}) {  // 700 x 35 floats: the parallel copies
    xt::xarray<float> a = xt::random::randn<float>({rows, std::size_t{5}});
    xt::xarray<float> bt = xt::random::randn<float>({std::size_t{7}, rows});  // read transposed
    xt::xarray<float> c = xt::random::randn<float>({std::size_t{23}});          // one row, broadcast
    xt::xarray<float> out = xt::zeros<float>({rows, std::size_t{35}});
    const ArrayRef ar = ref_of(a, DType::float32), br = ref_of(bt, DType::float32), cr = ref_of(c, DType::float32);
    const auto R = static_cast<std::int64_t>(rows);
    const ArrayRef b_view{br.data, br.dtype, {R, 7}, {br.strides[1], br.strides[0]}};
    const ArrayRef c_view{cr.data, cr.dtype, {R, 23}, {0, cr.strides[0]}};
    concatenate({ar, b_view, c_view}, 1, ref_of(out, DType::float32));
    xt::xarray<float> c_rows = xt::broadcast(c, {rows, std::size_t{23}});
    xt::xarray<float> want = xt::concatenate(xt::xtuple(a, xt::transpose(bt), c_rows), 1);
    EXPECT_EQ(out, want);
  }
  xt::xarray<float> a = xt::zeros<float>({2, 3}), out = xt::zeros<float>({2, 7});
  EXPECT_THROW(concatenate({ref_of(a, DType::float32)}, 1, ref_of(out, DType::float32)), std::invalid_argument);
  EXPECT_THROW(concatenate({ref_of(a, DType::float32)}, 2, ref_of(out, DType::float32)), std::invalid_argument);
}

class ReduceOnEveryIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (static_cast<int>(GetParam()) > static_cast<int>(detected_isa())) GTEST_SKIP() << "CPU lacks it";
    saved_ = active_isa();
    set_active_isa(GetParam());
  }
  void TearDown() override { set_active_isa(saved_); }
  Isa saved_ = Isa::scalar;
};

INSTANTIATE_TEST_SUITE_P(Isas, ReduceOnEveryIsa, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return isa_name(info.param); });

TEST_P(ReduceOnEveryIsa, SumOfManyOddLengthRows) {
  for (std::size_t rows : {1u, 3u, 4u, 5u, 9u}) {
    for (std::size_t n : {1u, 7u, 33u, 2049u}) {
      xt::xarray<double> src = xt::random::randn<double>({rows, n});
      xt::xarray<double> dst = xt::zeros<double>({n});
      ArrayRef s = ref_of(src, DType::float64);
      reduce_strided(ref_of(dst, DType::float64), ArrayRef{s.data, s.dtype, {static_cast<std::int64_t>(n),
                     static_cast<std::int64_t>(rows)}, {s.strides[1], s.strides[0]}}, 1, ReduceOp::sum);
      xt::xarray<double> want = xt::sum(src, {0});
      EXPECT_TRUE(xt::allclose(dst, want, 1e-12, 1e-12)) << rows << " x " << n;
    }
  }
}

TEST_P(ReduceOnEveryIsa, MaxPropagatesNaN) {
  xt::xarray<float> src = {{1.0f, 5.0f}, {std::nanf(""), 2.0f}, {3.0f, 4.0f}};
  xt::xarray<float> dst = xt::zeros<float>({2});
  ArrayRef s = ref_of(src, DType::float32);
  reduce_strided(ref_of(dst, DType::float32), ArrayRef{s.data, s.dtype, {2, 3}, {s.strides[1], s.strides[0]}}, 1,
                 ReduceOp::max);
  EXPECT_TRUE(std::isnan(dst(0)));
  EXPECT_EQ(dst(1), 5.0f);
}

TEST(Strided, ReduceSumMaxMinMean) {
  xt::random::seed(2);
  xt::xarray<float> src = xt::random::rand<float>({6, 4, 3});  // reduce dim 0 via a view
  ArrayRef s = ref_of(src, DType::float32);
  ArrayRef sv{s.data, s.dtype, {4, 3, 6}, {s.strides[1], s.strides[2], s.strides[0]}};
  for (auto [op, want] : std::vector<std::pair<ReduceOp, xt::xarray<float>>>{
           {ReduceOp::sum, xt::sum(src, {0})},
           {ReduceOp::max, xt::amax(src, {0})},
           {ReduceOp::min, xt::amin(src, {0})},
           {ReduceOp::mean, xt::mean(src, {0})}}) {
    xt::xarray<float> dst = xt::zeros<float>({4, 3});
    reduce_strided(ref_of(dst, DType::float32), sv, 1, op);
    EXPECT_TRUE(xt::allclose(dst, want, 1e-6, 1e-6));
  }
}

TEST(Strided, Bfloat16SumsInFloatAndRoundsOnce) {
  // 256 copies of 1 + 2^-8: a bf16 accumulator would stall at 256; float32 gets 257.
  const std::uint16_t one_plus = float_to_bf16(1.0f + 1.0f / 128);
  std::vector<std::uint16_t> src(256, one_plus);
  std::uint16_t out = 0;
  ArrayRef s{src.data(), DType::bfloat16, {256}, {2}};
  ArrayRef d{&out, DType::bfloat16, {}, {}};
  reduce_strided(d, s, 1, ReduceOp::sum);
  EXPECT_FLOAT_EQ(bf16_to_float(out), 258.0f);
  EXPECT_EQ(float_to_bf16(bf16_to_float(0x3f81)), 0x3f81);
}

TEST(Strided, RejectsMismatchedViews) {
  float a[4] = {0}, b[6] = {0};
  EXPECT_THROW(copy_strided(contiguous_ref(a, DType::float32, {4}), contiguous_ref(b, DType::float32, {6})),
               std::invalid_argument);
  EXPECT_THROW(reduce_strided(contiguous_ref(a, DType::float32, {4}), contiguous_ref(b, DType::float32, {6}), 0,
                              ReduceOp::sum),
               std::invalid_argument);
}

TEST(Strided, SelectMatchesDefinitionWithBroadcastAndNaN) {
  xt::xarray<float> x = {{1.0f, std::nanf(""), 3.0f}, {4.0f, 5.0f, -INFINITY}};
  xt::xarray<float> y = {7.0f, 8.0f, 9.0f};  // broadcast along rows
  xt::xarray<bool> c = {{true, true, false}, {false, true, true}};
  xt::xarray<float> out = xt::zeros<float>({2, 3});
  ArrayRef yr = ref_of(y, DType::float32);
  ArrayRef cr{c.data(), DType::bool_, {2, 3}, {3, 1}};
  select_strided(ref_of(out, DType::float32), cr, ref_of(x, DType::float32),
                 ArrayRef{yr.data, yr.dtype, {2, 3}, {0, 4}});
  EXPECT_EQ(out(0, 0), 1.0f);
  EXPECT_TRUE(std::isnan(out(0, 1)));
  EXPECT_EQ(out(0, 2), 9.0f);
  EXPECT_EQ(out(1, 0), 7.0f);
  EXPECT_EQ(out(1, 1), 5.0f);
  EXPECT_EQ(out(1, 2), -INFINITY);
  ArrayRef bad{c.data(), DType::int8, {2, 3}, {3, 1}};
  EXPECT_THROW(select_strided(ref_of(out, DType::float32), bad, ref_of(x, DType::float32), ref_of(x, DType::float32)),
               std::invalid_argument);
}

TEST(Strided, TransposingCopiesMatchXtensorOnOddSizes) {
  // The tiled path (a dim contiguous in src against the innermost dim, both >= one tile) and its
  // ragged edges, for 2-, 4- and 8-byte elements.
  xt::random::seed(7);
  for (auto [a, b, c] : std::vector<std::array<std::size_t, 3>>{{1, 16, 16}, {3, 17, 33}, {2, 40, 19}, {5, 64, 128}}) {
    xt::xarray<float> src = xt::random::rand<float>({a, b, c});
    xt::xarray<float> dst = xt::zeros<float>({a, c, b});
    ArrayRef s = ref_of(src, DType::float32);
    ArrayRef sv{s.data, s.dtype, {static_cast<std::int64_t>(a), static_cast<std::int64_t>(c), static_cast<std::int64_t>(b)},
                {s.strides[0], s.strides[2], s.strides[1]}};
    copy_strided(ref_of(dst, DType::float32), sv);
    xt::xarray<float> want = xt::transpose(src, {0, 2, 1});
    EXPECT_EQ(dst, want) << a << "x" << b << "x" << c;

    xt::xarray<double> src64 = xt::random::rand<double>({a, b, c});
    xt::xarray<double> dst64 = xt::zeros<double>({a, c, b});
    ArrayRef s64 = ref_of(src64, DType::float64);
    ArrayRef sv64{s64.data, s64.dtype, sv.shape, {s64.strides[0], s64.strides[2], s64.strides[1]}};
    copy_strided(ref_of(dst64, DType::float64), sv64);
    xt::xarray<double> want64 = xt::transpose(src64, {0, 2, 1});
    EXPECT_EQ(dst64, want64);
  }
}
