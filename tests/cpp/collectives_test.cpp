// Each collective against a loop written from its definition, on a (4, 2) mesh.
#include "shardlab/collectives.hpp"

#include <gtest/gtest.h>

#include <xtensor/xarray.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

using namespace shardlab;

namespace {

const Mesh kMesh({"x", "y"}, {4, 2});

ArrayRef ref(xt::xarray<float>& a) {
  return contiguous_ref(a.data(), DType::float32, Shape(a.shape().begin(), a.shape().end()));
}

// Device (i, j)'s local value of mesh-factorized storage `s` (rank-1 local).
xt::xarray<float> local(const xt::xarray<float>& s, std::size_t i, std::size_t j) {
  return xt::view(s, s.shape()[0] == 1 ? 0 : i, s.shape()[1] == 1 ? 0 : j, xt::all());
}

xt::xarray<float> run_out(const Shape& shape) {
  return xt::zeros<float>(std::vector<std::size_t>(shape.begin(), shape.end()));
}

}  // namespace

TEST(Collectives, AllGatherTiledOverX) {
  xt::xarray<float> in = xt::random::rand<float>({4, 2, 3});
  xt::xarray<float> out = run_out(all_gather_shape(kMesh, {4, 2, 3}, {"x"}, 0, true));
  ASSERT_EQ(out.shape()[0], 1u);
  Event e = all_gather(kMesh, ref(in), ref(out), {"x"}, 0, true);
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 2; ++j) {
      xt::xarray<float> want = xt::concatenate(xt::xtuple(local(in, 0, j), local(in, 1, j), local(in, 2, j),
                                                          local(in, 3, j)));
      EXPECT_EQ(local(out, i, j), want);
    }
  }
  EXPECT_EQ(e.group_size, 4);
  EXPECT_EQ(e.num_groups, 2);
  EXPECT_EQ(e.bytes_in, 12);
  EXPECT_EQ(e.bytes_out, 48);
  EXPECT_DOUBLE_EQ(e.bytes_sent, 36);
}

TEST(Collectives, AllGatherTupleAxesMajorToMinor) {
  xt::xarray<float> in = xt::random::rand<float>({4, 2, 1});
  xt::xarray<float> out = run_out(all_gather_shape(kMesh, {4, 2, 1}, {"y", "x"}, 0, true));
  all_gather(kMesh, ref(in), ref(out), {"y", "x"}, 0, true);
  for (std::size_t g = 0; g < 8; ++g) EXPECT_EQ(out(0, 0, g), in(g % 4, g / 4, 0));  // y major
}

TEST(Collectives, PsumOfVaryingAndInvariantValues) {
  xt::xarray<float> in = xt::random::rand<float>({4, 2, 5});
  xt::xarray<float> out = run_out(all_reduce_shape(kMesh, {4, 2, 5}, {"x"}));
  all_reduce(kMesh, ref(in), ref(out), {"x"}, ReduceOp::sum);
  EXPECT_TRUE(xt::allclose(xt::view(out, 0, xt::all(), xt::all()), xt::sum(in, {0})));
  xt::xarray<float> inv = xt::random::rand<float>({1, 1, 5});  // same on every device
  xt::xarray<float> out2 = run_out(all_reduce_shape(kMesh, {1, 1, 5}, {"x", "y"}));
  all_reduce(kMesh, ref(inv), ref(out2), {"x", "y"}, ReduceOp::sum);
  EXPECT_TRUE(xt::allclose(out2, 8.0f * inv));
}

TEST(Collectives, PsumScatterTiledAndUntiled) {
  xt::xarray<float> in = xt::random::rand<float>({4, 2, 8});
  xt::xarray<float> out = run_out(psum_scatter_shape(kMesh, {4, 2, 8}, {"x"}, 0, true));
  psum_scatter(kMesh, ref(in), ref(out), {"x"}, 0, true);
  xt::xarray<float> total = xt::sum(in, {0});
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 2; ++j) {
      EXPECT_TRUE(xt::allclose(local(out, i, j), xt::view(total, j, xt::range(2 * i, 2 * i + 2))));
    }
  }
  xt::xarray<float> in4 = xt::random::rand<float>({4, 2, 4});
  xt::xarray<float> out4 = run_out(psum_scatter_shape(kMesh, {4, 2, 4}, {"x"}, 0, false));
  ASSERT_EQ(out4.dimension(), 2u);  // the scattered dim is gone
  psum_scatter(kMesh, ref(in4), ref(out4), {"x"}, 0, false);
  xt::xarray<float> t4 = xt::sum(in4, {0});
  EXPECT_NEAR(out4(3, 1), t4(1, 3), 1e-5);
  EXPECT_THROW(psum_scatter_shape(kMesh, {4, 2, 6}, {"x"}, 0, false), std::invalid_argument);
  EXPECT_THROW(psum_scatter_shape(kMesh, {4, 2, 6}, {"x"}, 0, true), std::invalid_argument);
}

TEST(Collectives, AllToAllTiled) {
  // local [4 * 2, 3]: split dim 0 into 4 chunks of 2, concat along dim 1.
  xt::xarray<float> in = xt::random::rand<float>({4, 1, 8, 3});
  xt::xarray<float> out = run_out(all_to_all_shape(kMesh, {4, 1, 8, 3}, {"x"}, 0, 1, true));
  ASSERT_EQ(out.shape(), (std::vector<std::size_t>{4, 1, 2, 12}));
  all_to_all(kMesh, ref(in), ref(out), {"x"}, 0, 1, true);
  for (std::size_t g = 0; g < 4; ++g) {      // receiver
    for (std::size_t k = 0; k < 4; ++k) {    // sender
      for (std::size_t a = 0; a < 2; ++a) {
        for (std::size_t b = 0; b < 3; ++b) EXPECT_EQ(out(g, 0, a, 3 * k + b), in(k, 0, 2 * g + a, b));
      }
    }
  }
}

TEST(Collectives, AllToAllUntiledSwapsDeviceAndSplitIndex) {
  xt::xarray<float> in = xt::random::rand<float>({4, 2, 4});
  xt::xarray<float> out = run_out(all_to_all_shape(kMesh, {4, 2, 4}, {"x"}, 0, 0, false));
  all_to_all(kMesh, ref(in), ref(out), {"x"}, 0, 0, false);
  for (std::size_t g = 0; g < 4; ++g) {
    for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(out(g, 1, k), in(k, 1, g));
  }
  EXPECT_THROW(all_to_all_shape(kMesh, {4, 2, 3}, {"x"}, 0, 0, false), std::invalid_argument);
}

TEST(Collectives, PpermuteShiftsAndZeroFills) {
  xt::xarray<float> in = xt::random::rand<float>({4, 2, 2});
  xt::xarray<float> out = run_out(ppermute_shape(kMesh, {4, 2, 2}, {"x"}, {{0, 1}, {1, 2}, {2, 3}}));
  ppermute(kMesh, ref(in), ref(out), {"x"}, {{0, 1}, {1, 2}, {2, 3}});
  for (std::size_t j = 0; j < 2; ++j) {
    EXPECT_EQ(local(out, 0, j), xt::zeros<float>({2}));
    for (std::size_t i = 1; i < 4; ++i) EXPECT_EQ(local(out, i, j), local(in, i - 1, j));
  }
  EXPECT_THROW(ppermute_shape(kMesh, {4, 2, 2}, {"x"}, {{0, 1}, {0, 2}}), std::invalid_argument);
  EXPECT_THROW(ppermute_shape(kMesh, {4, 2, 2}, {"x"}, {{0, 1}, {2, 1}}), std::invalid_argument);
  EXPECT_THROW(ppermute_shape(kMesh, {4, 2, 2}, {"x"}, {{0, 4}}), std::invalid_argument);
}

TEST(Collectives, RootedCollectives) {
  xt::xarray<float> in = xt::random::rand<float>({4, 1, 4});
  xt::xarray<float> b = run_out(broadcast_shape(kMesh, {4, 1, 4}, {"x"}, 2));
  broadcast(kMesh, ref(in), ref(b), {"x"}, 2);
  EXPECT_EQ(local(b, 0, 0), local(in, 2, 0));

  xt::xarray<float> r = run_out(reduce_shape(kMesh, {4, 1, 4}, {"x"}, 1));
  reduce(kMesh, ref(in), ref(r), {"x"}, 1, ReduceOp::sum);
  xt::xarray<float> total = xt::sum(in, {0});
  EXPECT_TRUE(xt::allclose(local(r, 1, 0), xt::view(total, 0, xt::all())));
  EXPECT_EQ(local(r, 0, 0), xt::zeros<float>({4}));

  xt::xarray<float> g = run_out(gather_shape(kMesh, {4, 1, 4}, {"x"}, 3, 0, true));
  gather(kMesh, ref(in), ref(g), {"x"}, 3, 0, true);
  EXPECT_EQ(g(3, 0, 5), in(1, 0, 1));
  EXPECT_EQ(g(2, 0, 5), 0.0f);

  xt::xarray<float> s = run_out(scatter_shape(kMesh, {4, 1, 4}, {"x"}, 0, 0, true));
  scatter(kMesh, ref(in), ref(s), {"x"}, 0, 0, true);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(s(i, 0, 0), in(0, 0, i));
  EXPECT_THROW(broadcast_shape(kMesh, {4, 1, 4}, {"x"}, 4), std::invalid_argument);
}

TEST(Collectives, AxisIndexAndErrors) {
  std::vector<std::int32_t> data(8);
  ArrayRef out{data.data(), DType::int32, {4, 2}, {8, 4}};
  axis_index(kMesh, out, {"x", "y"});
  for (int d = 0; d < 8; ++d) EXPECT_EQ(data[d], d);
  EXPECT_THROW(all_gather_shape(kMesh, {4, 2, 3}, {"z"}, 0, true), std::invalid_argument);
  EXPECT_THROW(all_gather_shape(kMesh, {3, 2, 3}, {"x"}, 0, true), std::invalid_argument);
  EXPECT_THROW(all_gather_shape(kMesh, {4, 2, 3}, {"x"}, 1, true), std::invalid_argument);
  EXPECT_THROW(all_gather_shape(kMesh, {4, 2, 3}, {}, 0, true), std::invalid_argument);
}
