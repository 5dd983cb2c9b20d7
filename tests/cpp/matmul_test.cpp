// matmul_shape / matmul_problem / matmul: numpy's batched matmul rules on strided ArrayRefs,
// checked against xtensor expressions of the definition.
#include "shardlab/matmul.hpp"

#include <gtest/gtest.h>

#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include "shardlab/xtensor.hpp"

using namespace shardlab;

namespace {

// C[..., i, k] = sum_j A[..., i, j] B[..., j, k] for rank-3 operands (batch dims broadcast).
xt::xarray<double> definition(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  xt::xarray<double> ad = a, bd = b;
  return xt::sum(xt::view(ad, xt::all(), xt::all(), xt::all(), xt::newaxis()) *
                     xt::view(bd, xt::all(), xt::newaxis(), xt::all(), xt::all()),
                 {2});
}

}  // namespace

TEST(Matmul, ShapesFollowNumpy) {
  EXPECT_EQ(matmul_shape({4, 1, 3, 5}, {1, 2, 5, 7}), (Shape{4, 2, 3, 7}));
  EXPECT_EQ(matmul_shape({0, 3}, {3, 4}), (Shape{0, 4}));
  try {
    matmul_shape({3, 4}, {5, 6});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[gemm] a has shape (3, 4) and b (5, 6): inner dimensions 4 and 5 differ"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(matmul_shape({2, 3, 4}, {3, 4, 5}), std::invalid_argument);  // batch 2 vs 3
  EXPECT_THROW(matmul_shape({3, 4}, {2, 4, 5}), std::invalid_argument);     // ranks differ
  EXPECT_THROW(matmul_shape({4}, {4}), std::invalid_argument);
}

TEST(Matmul, BroadcastBatchAndTransposedViewsMatchTheDefinition) {
  xt::random::seed(11);
  const xt::xarray<float> a = xt::random::randn<float>({3, 9, 17});
  const xt::xarray<float> bt = xt::random::randn<float>({1, 5, 17});  // B stored transposed
  xt::xarray<float> c = xt::zeros<float>({3, 9, 5});
  const ArrayRef br = xt_ref(bt);
  const ArrayRef b{br.data, br.dtype, {1, 17, 5}, {0, br.strides[2], br.strides[1]}};
  matmul(xt_ref(a), b, xt_ref(c));
  const xt::xarray<float> b_view = xt::transpose(bt, {0, 2, 1});
  EXPECT_TRUE(xt::allclose(c, definition(a, b_view), 1e-5, 1e-5));
}

TEST(Matmul, RejectsWhatTheKernelCannotRead) {
  xt::xarray<float> a = xt::ones<float>({2, 2}), c = xt::zeros<float>({2, 2});
  xt::xarray<double> d = xt::ones<double>({2, 2});
  EXPECT_THROW(matmul(xt_ref(d), xt_ref(d), xt_ref(c)), std::invalid_argument);  // float64
  ArrayRef half = xt_ref(a);
  half.strides[1] = 2;  // half an element
  EXPECT_THROW(matmul(half, xt_ref(a), xt_ref(c)), std::invalid_argument);
  xt::xarray<float> wrong = xt::zeros<float>({2, 3});
  EXPECT_THROW(matmul(xt_ref(a), xt_ref(a), xt_ref(wrong)), std::invalid_argument);
  std::vector<std::uint16_t> bits(4, float_to_bf16(1.0f));
  const ArrayRef bf{bits.data(), DType::bfloat16, {2, 2}, {4, 2}};
  EXPECT_THROW(matmul(xt_ref(a), bf, xt_ref(c)), std::invalid_argument);  // mixed dtypes
  matmul(bf, bf, xt_ref(c));
  EXPECT_EQ(c, 2.0f * xt::ones<float>({2, 2}));
}
