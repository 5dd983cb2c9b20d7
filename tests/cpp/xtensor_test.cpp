// The xtensor API (shardlab/xtensor.hpp): device_put / device_get against xt::view of the
// global array, shards as views into the storage, every Emulator collective against an
// xtensor expression of its definition, and the ledger it keeps.
#include "shardlab/xtensor.hpp"

#include <gtest/gtest.h>

#include <xtensor/xbuilder.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

using namespace shardlab;

namespace {

// Rows and columns device (x, y) of a (4, 2) mesh holds under P(('x', 'y'), None): block
// x * 2 + y of 8 along dim 0.
xt::xarray<float> rows_block(const xt::xarray<float>& g, std::int64_t block, std::int64_t n) {
  const auto len = static_cast<std::int64_t>(g.shape()[0]) / n;
  return xt::view(g, xt::range(block * len, (block + 1) * len), xt::all());
}

}  // namespace

TEST(Xtensor, DevicePutMatchesXtViewsForEverySpec) {
  Emulator em(Mesh({"x", "y"}, {4, 2}));
  xt::random::seed(3);
  const xt::xarray<float> g = xt::random::rand<float>({8, 6});
  struct Case {
    PartitionSpec spec;
    std::vector<std::size_t> storage;
  };
  for (const Case& c : {Case{{{"x"}, {"y"}}, {4, 2, 2, 3}}, Case{{{"y"}, {}}, {1, 2, 4, 6}},
                        Case{{{"x", "y"}}, {4, 2, 1, 6}}, Case{{{"y", "x"}}, {4, 2, 1, 6}},
                        Case{{}, {1, 1, 8, 6}}}) {
    const auto s = em.device_put(g, c.spec);
    ASSERT_EQ(s.shape(), c.storage) << spec_str(c.spec);
    const NamedSharding sharding = em.sharding(c.spec);
    for (std::int64_t d = 0; d < 8; ++d) {
      const auto idx = sharding.device_indices(d, {8, 6});
      xt::xarray<float> want = xt::view(g, xt::range(idx[0].first, idx[0].second),
                                        xt::range(idx[1].first, idx[1].second));
      EXPECT_EQ(em.shard(s, d), want) << spec_str(c.spec) << " device " << d;
    }
    EXPECT_EQ(em.device_get(s, c.spec), g) << spec_str(c.spec);
  }
  // Major-to-minor: under P(('y', 'x')) device (x=1, y=1) holds block y * 4 + x = 5.
  const auto yx = em.device_put(g, {{"y", "x"}});
  EXPECT_EQ(em.shard(yx, em.mesh().device_id({1, 1})), rows_block(g, 5, 8));
}

TEST(Xtensor, ShardsAreViewsIntoTheStorage) {
  Emulator em(Mesh({"x"}, {4}));
  xt::xarray<double> g = xt::arange<double>(24.0);
  g.reshape({8, 3});
  auto s = em.device_put(g, {{"x"}});
  const auto v = em.shard(s, 3);
  EXPECT_EQ(&v(0, 0), s.data() + 3 * 6);  // no copy: the device's rows inside the storage
  s(3, 1, 2) = -1.0;                      // written through the storage, seen in the view
  EXPECT_EQ(v(1, 2), -1.0);
  // A replicated value: every device's view is the one block.
  const auto r = em.device_put(g, {});
  EXPECT_EQ(&em.shard(r, 0)(0, 0), &em.shard(r, 3)(0, 0));
}

TEST(Xtensor, RefAndViewRoundTripStridesAndDtypes) {
  xt::xarray<std::int32_t> a = xt::arange<std::int32_t>(12);
  a.reshape({3, 4});
  const ArrayRef r = xt_ref(a);
  EXPECT_EQ(r.dtype, DType::int32);
  EXPECT_EQ(r.strides, (Shape{16, 4}));
  // The transposed view through byte strides, without a copy.
  const ArrayRef t{r.data, r.dtype, {4, 3}, {4, 16}};
  const auto tv = xt_view<const std::int32_t>(t);
  EXPECT_EQ(tv, xt::transpose(a));
  EXPECT_THROW(xt_view<float>(r), std::invalid_argument);                         // wrong dtype
  EXPECT_THROW(xt_view<std::int32_t>(ArrayRef{r.data, r.dtype, {3}, {-4}}), std::invalid_argument);
  EXPECT_THROW(xt_view<std::int32_t>(ArrayRef{r.data, r.dtype, {3}, {6}}), std::invalid_argument);
  // Zero strides broadcast.
  const auto b = xt_view<const std::int32_t>(ArrayRef{r.data, r.dtype, {2, 4}, {0, 4}});
  EXPECT_EQ(xt::view(b, 0, xt::all()), xt::view(a, 0, xt::all()));
  EXPECT_EQ(xt::view(b, 1, xt::all()), xt::view(a, 0, xt::all()));
}

TEST(Xtensor, CollectivesMatchTheirDefinitions) {
  Emulator em(Mesh({"x", "y"}, {4, 2}));
  xt::random::seed(5);
  const xt::xarray<float> g = xt::random::rand<float>({8, 4});
  const auto s = em.device_put(g, {{"x"}, {"y"}});  // local (2, 2)

  const auto total = em.psum(s, {"x"});
  EXPECT_TRUE(xt::allclose(xt::view(total, 0, xt::all()), xt::sum(s, {0})));
  EXPECT_TRUE(xt::allclose(em.pmean(s, {"x"}), xt::mean(s, {0}, xt::keep_dims)));
  EXPECT_EQ(em.pmax(s, {"x", "y"}), xt::amax(s, {0, 1}, xt::keep_dims));
  EXPECT_EQ(em.pmin(s, {"y"}), xt::amin(s, {1}, xt::keep_dims));

  // all_gather over x, tiled along local dim 0: the global column block of each y.
  const auto cols = em.all_gather(s, {"x"}, 0, true);
  for (std::int64_t y = 0; y < 2; ++y) {
    EXPECT_EQ(em.shard(cols, em.mesh().device_id({0, y})), xt::view(g, xt::all(), xt::range(2 * y, 2 * y + 2)));
  }
  // Untiled: a new leading local dim indexed by the x coordinate.
  const auto stacked = em.all_gather(s, {"x"});
  EXPECT_EQ(stacked.shape(), (std::vector<std::size_t>{1, 2, 4, 2, 2}));
  EXPECT_EQ(xt::view(stacked, 0, 1, 3), xt::view(s, 3, 1));

  // psum_scatter over y of a value replicated along y: twice the value, split in halves.
  const auto rep = em.device_put(g, {{"x"}});  // (4, 1, 2, 4)
  const auto halves = em.psum_scatter(rep, {"y"}, 1, true);
  for (std::int64_t d = 0; d < 8; ++d) {
    const auto c = em.mesh().coords(d);
    xt::xarray<float> want = 2.0f * xt::view(g, xt::range(2 * c[0], 2 * c[0] + 2), xt::range(2 * c[1], 2 * c[1] + 2));
    EXPECT_TRUE(xt::allclose(em.shard(halves, d), want)) << d;
  }

  // all_to_all over x: split local dim 1 (size 4 after tiling up), concat along dim 0.
  const auto wide = em.all_gather(s, {"y"}, 1, true);  // (4, 1, 2, 4): rows of x, all columns
  const auto moved = em.all_to_all(wide, {"x"}, 1, 0, true);  // (4, 1, 8, 1): column x, all rows
  for (std::int64_t x = 0; x < 4; ++x) {
    xt::xarray<float> want = xt::view(g, xt::all(), xt::range(x, x + 1));
    EXPECT_EQ(em.shard(moved, em.mesh().device_id({x, 0})), want) << x;
  }

  // ppermute: devices that receive nothing hold zeros.
  const auto shifted = em.ppermute(s, {"x"}, {{0, 1}, {1, 2}});
  EXPECT_EQ(xt::view(shifted, 1), xt::view(s, 0));
  EXPECT_EQ(xt::view(shifted, 2), xt::view(s, 1));
  EXPECT_EQ(xt::view(shifted, 0), xt::zeros<float>({2, 2, 2}));
  EXPECT_EQ(xt::view(shifted, 3), xt::zeros<float>({2, 2, 2}));

  std::vector<std::string> ops;
  for (const auto& e : em.ledger().events()) ops.push_back(e.op);
  EXPECT_EQ(ops, (std::vector<std::string>{"psum", "pmean", "pmax", "pmin", "all_gather", "all_gather",
                                           "psum_scatter", "all_gather", "all_to_all", "ppermute"}));
  const Event& psum = em.ledger().events()[0];
  EXPECT_EQ(psum.group_size, 4);
  EXPECT_EQ(psum.num_groups, 2);
  EXPECT_EQ(psum.bytes_in, 16);
  EXPECT_DOUBLE_EQ(psum.bytes_sent, 2.0 * 3 / 4 * 16);
}

TEST(Xtensor, MatmulPerDeviceAndErrors) {
  Emulator em(Mesh({"x"}, {2}));
  xt::random::seed(8);
  const xt::xarray<float> a = xt::random::randn<float>({6, 5});
  const xt::xarray<float> b = xt::random::randn<float>({5, 3});
  const auto c = em.matmul(em.device_put(a, {{"x"}}), em.device_put(b, {}));  // rows split, B replicated
  xt::xarray<float> want = xt::sum(xt::view(a, xt::all(), xt::all(), xt::newaxis()) *
                                       xt::view(b, xt::newaxis(), xt::all(), xt::all()),
                                   {1});
  EXPECT_TRUE(xt::allclose(em.device_get(c, {{"x"}}), want, 1e-5, 1e-5));
  const Event& e = em.ledger().events().back();
  EXPECT_EQ(e.op, "matmul");
  EXPECT_DOUBLE_EQ(e.flops, 2.0 * 3 * 3 * 5);
  EXPECT_EQ(e.bytes_out, 3 * 3 * 4);
  EXPECT_DOUBLE_EQ(e.bytes_sent, 0.0);
  EXPECT_THROW(em.matmul(em.device_put(a, {{"x"}}), em.device_put(a, {})), std::invalid_argument);
}

TEST(Xtensor, ErrorsNameTheOpAndTheShape) {
  Emulator em(Mesh({"x", "y"}, {4, 2}));
  const xt::xarray<float> g = xt::zeros<float>({6, 4});
  try {
    em.device_put(g, {{"x"}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[device_put] dimension 0 of shape (6, 4)"), std::string::npos) << e.what();
  }
  const auto s = em.device_put(g, {{}, {"x"}});
  try {
    em.device_get(s, {{"y"}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[device_get] storage of shape (4, 1, 6, 1)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(em.psum(s, {"z"}), std::invalid_argument);
  EXPECT_THROW(em.shard(s, 8), std::invalid_argument);
}

TEST(Xtensor, LedgerTableListsEveryEvent) {
  Emulator em(Mesh({"x"}, {4}));
  const auto s = em.device_put(xt::xarray<float>(xt::ones<float>({8})), {{"x"}});
  em.psum(s, {"x"});
  em.all_gather(s, {"x"}, 0, true);
  const std::string t = em.ledger().table();
  EXPECT_NE(t.find("psum"), std::string::npos) << t;
  EXPECT_NE(t.find("all_gather"), std::string::npos) << t;
  EXPECT_NE(t.find("2 events, 36 bytes sent per device"), std::string::npos) << t;  // 2*3/4*8 + 3/4*16
}
