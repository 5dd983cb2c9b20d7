#include "shardlab/scatter_add.hpp"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <xtensor/xarray.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

using namespace shardlab;

namespace {

template <class T>
ArrayRef ref_of(xt::xarray<T>& a, DType dtype) {
  return contiguous_ref(a.data(), dtype, Shape(a.shape().begin(), a.shape().end()));
}

// The kernel against the element-at-a-time reference on odd sizes, with repeated indices.
template <class T>
void check_against_reference(std::int64_t P, std::int64_t R, std::int64_t N, std::int64_t C, unsigned seed) {
  xt::random::seed(seed);
  xt::xarray<T> src = xt::random::randn<T>({P, N, C});
  xt::xarray<std::int32_t> index = xt::random::randint<std::int32_t>({P, N}, 0, static_cast<std::int32_t>(R));
  xt::xarray<T> start = xt::random::randn<T>({P, R, C});
  xt::xarray<T> got = start, want = start;
  const DType dt = dtype_v<T>;
  scatter_add_rows(ref_of(got, dt), ref_of(index, DType::int32), ref_of(src, dt));
  scatter_add_rows_reference(ref_of(want, dt), ref_of(index, DType::int32), ref_of(src, dt));
  // Same additions in the same order per row: bit-equal, not just close.
  EXPECT_EQ(got, want) << "P=" << P << " R=" << R << " N=" << N << " C=" << C;
}

}  // namespace

TEST(ScatterAddRows, MatchesReferenceOnOddSizes) {
  unsigned seed = 1;
  for (auto [P, R, N, C] : std::vector<std::array<std::int64_t, 4>>{
           {1, 1, 1, 1}, {1, 7, 13, 5}, {3, 17, 40, 33}, {2, 5, 300, 129}, {8, 1024, 512, 64}}) {
    check_against_reference<float>(P, R, N, C, seed++);
    check_against_reference<double>(P, R, N, C, seed++);
  }
}

TEST(ScatterAddRows, AccumulatesRepeatedRows) {
  xt::xarray<float> dst = xt::zeros<float>({1, 3, 2});
  xt::xarray<std::int32_t> index = {{2, 0, 2, 2}};
  xt::xarray<float> src = {{{1, 2}, {3, 4}, {5, 6}, {7, 8}}};
  scatter_add_rows(ref_of(dst, DType::float32), ref_of(index, DType::int32), ref_of(src, DType::float32));
  xt::xarray<float> want = {{{3, 4}, {0, 0}, {13, 16}}};
  EXPECT_EQ(dst, want);
}

TEST(ScatterAddRows, StridedSourceIsRead) {
  // src viewed transposed: [P=1, N=3, C=2] over memory laid out [C][N].
  xt::xarray<float> mem = {{1, 2, 3}, {10, 20, 30}};
  ArrayRef src{mem.data(), DType::float32, {1, 3, 2}, {0, 4, 12}};
  xt::xarray<float> dst = xt::zeros<float>({1, 2, 2});
  xt::xarray<std::int32_t> index = {{1, 1, 0}};
  scatter_add_rows(ref_of(dst, DType::float32), ref_of(index, DType::int32), src);
  xt::xarray<float> want = {{{3, 30}, {3, 30}}};
  EXPECT_EQ(dst, want);
}

TEST(ScatterAddRows, RejectsOutOfRangeIndexBeforeWriting) {
  xt::xarray<float> dst = xt::zeros<float>({1, 4, 2});
  xt::xarray<std::int32_t> index = {{0, 4}};
  xt::xarray<float> src = xt::ones<float>({1, 2, 2});
  try {
    scatter_add_rows(ref_of(dst, DType::float32), ref_of(index, DType::int32), ref_of(src, DType::float32));
    FAIL() << "expected std::out_of_range";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("index 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dst, xt::xarray<float>(xt::zeros<float>({1, 4, 2})));  // nothing written
}

TEST(ScatterAddRows, RejectsMismatchedShapesAndDtypes) {
  xt::xarray<float> dst = xt::zeros<float>({1, 4, 2});
  xt::xarray<std::int32_t> index = {{0, 1}};
  xt::xarray<float> src3 = xt::ones<float>({1, 2, 3});
  EXPECT_THROW(scatter_add_rows(ref_of(dst, DType::float32), ref_of(index, DType::int32), ref_of(src3, DType::float32)),
               std::invalid_argument);
  xt::xarray<double> srcd = xt::ones<double>({1, 2, 2});
  EXPECT_THROW(scatter_add_rows(ref_of(dst, DType::float32), ref_of(index, DType::int32), ref_of(srcd, DType::float64)),
               std::invalid_argument);
}
