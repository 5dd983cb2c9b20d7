#include "shardlab/local_array.hpp"

#include <gtest/gtest.h>

#include <random>
#include <xtensor/xarray.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

using namespace shardlab;

namespace {

template <class T>
ArrayRef ref_of(xt::xarray<T>& a, DType dtype) {
  Shape shape(a.shape().begin(), a.shape().end());
  return contiguous_ref(a.data(), dtype, shape);
}

}  // namespace

TEST(LocalArray, CopyTransposedViewMatchesXtensor) {
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

TEST(LocalArray, CopyBroadcastsZeroStrides) {
  xt::xarray<std::int32_t> src = {1, 2, 3};
  xt::xarray<std::int32_t> dst = xt::zeros<std::int32_t>({4, 3});
  ArrayRef s = ref_of(src, DType::int32);
  copy_strided(ref_of(dst, DType::int32), ArrayRef{s.data, s.dtype, {4, 3}, {0, 4}});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(xt::xarray<std::int32_t>(xt::row(dst, i)), src);
}

TEST(LocalArray, LargeCopyIsExactInParallel) {
  xt::xarray<double> src = xt::random::randn<double>({1 << 16, 9});
  xt::xarray<double> dst = xt::zeros<double>({1 << 16, 9});
  copy_strided(ref_of(dst, DType::float64), ref_of(src, DType::float64));
  EXPECT_EQ(dst, src);
}

TEST(LocalArray, ReduceSumMaxMinMean) {
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

TEST(LocalArray, Bfloat16SumsInFloatAndRoundsOnce) {
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

TEST(LocalArray, RejectsMismatchedViews) {
  float a[4] = {0}, b[6] = {0};
  EXPECT_THROW(copy_strided(contiguous_ref(a, DType::float32, {4}), contiguous_ref(b, DType::float32, {6})),
               std::invalid_argument);
  EXPECT_THROW(reduce_strided(contiguous_ref(a, DType::float32, {4}), contiguous_ref(b, DType::float32, {6}), 0,
                              ReduceOp::sum),
               std::invalid_argument);
}
