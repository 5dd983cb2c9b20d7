#include "shardlab/sharding.hpp"

#include <gtest/gtest.h>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include "shardlab/xtensor.hpp"

using namespace shardlab;

TEST(NamedSharding, ShardShapeAndIndices) {
  Mesh mesh({"x", "y"}, {4, 2});
  NamedSharding s(mesh, {{"x"}, {"y"}});
  EXPECT_EQ(s.shard_shape({8, 6}), (Shape{2, 3}));
  const auto idx = s.device_indices(mesh.device_id({3, 1}), {8, 6});
  EXPECT_EQ(idx[0], (std::pair<std::int64_t, std::int64_t>{6, 8}));
  EXPECT_EQ(idx[1], (std::pair<std::int64_t, std::int64_t>{3, 6}));
}

TEST(NamedSharding, MultiAxisDimIsMajorToMinor) {
  Mesh mesh({"x", "y"}, {2, 4});
  NamedSharding yx(mesh, {{"y", "x"}});
  // device (x=1, y=2): block = y * 2 + x = 5 of 8
  const auto idx = yx.device_indices(mesh.device_id({1, 2}), {16});
  EXPECT_EQ(idx[0].first, 10);
  EXPECT_EQ(idx[0].second, 12);
}

TEST(NamedSharding, ReplicaIdsCountUnusedAxes) {
  Mesh mesh({"x", "y"}, {2, 3});
  NamedSharding s(mesh, {{"x"}});
  for (std::int64_t i = 0; i < 2; ++i) {
    for (std::int64_t j = 0; j < 3; ++j) EXPECT_EQ(s.replica_id(mesh.device_id({i, j})), j);
  }
  EXPECT_FALSE(s.is_fully_replicated());
  EXPECT_TRUE(NamedSharding(mesh, {}).is_fully_replicated());
  EXPECT_EQ(s.varying(), (std::vector<bool>{true, false}));
}

TEST(NamedSharding, RejectsBadSpecs) {
  Mesh mesh({"x", "y"}, {4, 2});
  EXPECT_THROW(NamedSharding(mesh, {{"x"}, {"x"}}), DuplicateSpecError);
  EXPECT_THROW(NamedSharding(mesh, {{"x", "x"}}), DuplicateSpecError);
  EXPECT_THROW(NamedSharding(mesh, {{"z"}}), std::invalid_argument);
  NamedSharding s(mesh, {{"x"}, {}, {"y"}});
  EXPECT_THROW(s.check_shape({8, 2}, "device_put"), std::invalid_argument);  // spec longer than rank
  try {
    NamedSharding(mesh, {{"x", "y"}}).check_shape({12}, "device_put");
    FAIL();
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[device_put]"), std::string::npos);
    EXPECT_NE(msg.find("not divisible by 8"), std::string::npos);
  }
}

TEST(NamedSharding, StorageViewSeesEachDeviceBlockWithoutACopy) {
  Mesh mesh({"x", "y"}, {2, 3});
  xt::xarray<float> g = xt::arange<float>(36.0f);
  g.reshape({6, 6});
  for (const PartitionSpec& spec : {PartitionSpec{{"x"}, {"y"}}, PartitionSpec{{"y", "x"}},
                                    PartitionSpec{{}, {"x", "y"}}, PartitionSpec{}}) {
    NamedSharding s(mesh, spec);
    const ArrayRef view = s.storage_view(xt_ref(g));
    EXPECT_EQ(view.data, g.data()) << spec_str(spec);
    EXPECT_EQ(view.shape, s.storage_shape({6, 6})) << spec_str(spec);
    EXPECT_EQ(s.global_shape(view.shape), (Shape{6, 6})) << spec_str(spec);
    for (std::int64_t d = 0; d < mesh.size(); ++d) {
      const auto idx = s.device_indices(d, {6, 6});
      xt::xarray<float> want = xt::view(g, xt::range(idx[0].first, idx[0].second), xt::range(idx[1].first, idx[1].second));
      EXPECT_EQ(xt_view<const float>(local_view(mesh, view, d)), want) << spec_str(spec) << " device " << d;
    }
  }
  NamedSharding s(mesh, {{"x"}});
  EXPECT_EQ(s.storage_shape({4, 5}), (Shape{2, 1, 2, 5}));
  EXPECT_THROW(s.global_shape({2, 3, 2, 5}), std::invalid_argument);  // y is not in the spec
  EXPECT_THROW(s.global_shape({2, 1}), std::invalid_argument);        // no local dims
  EXPECT_THROW(local_view(mesh, ArrayRef{g.data(), DType::float32, {4, 1, 2}, {8, 0, 4}}, 0), std::invalid_argument);
}
