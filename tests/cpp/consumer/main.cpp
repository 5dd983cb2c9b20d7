// Links shardlab::core from an install prefix: a psum over x of an array sharded on (x, y)
// equals the xtensor sum of the blocks. Exits non-zero on any mismatch.
#include <cstdio>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include "shardlab/xtensor.hpp"

int main() {
  shardlab::Emulator em(shardlab::Mesh({"x", "y"}, {2, 2}));
  xt::xarray<float> a = xt::arange<float>(16.0f);
  a.reshape({4, 4});
  const auto stored = em.device_put(a, {{"x"}, {"y"}});
  const auto total = em.psum(stored, {"x"});
  // Device (x, y) holds rows 2x..2x+1, columns 2y..2y+1; the psum over x adds the two row blocks.
  for (std::int64_t y = 0; y < 2; ++y) {
    xt::xarray<float> want = xt::view(a, xt::range(0, 2), xt::range(2 * y, 2 * y + 2)) +
                             xt::view(a, xt::range(2, 4), xt::range(2 * y, 2 * y + 2));
    for (std::int64_t x = 0; x < 2; ++x) {
      if (em.shard(total, em.mesh().device_id({x, y})) != want) {
        std::printf("consumer: psum mismatch on device (%lld, %lld)\n", static_cast<long long>(x),
                    static_cast<long long>(y));
        return 1;
      }
    }
  }
  if (em.ledger().size() != 1 || em.ledger().events()[0].op != "psum") return 1;
  std::printf("%sconsumer: ok\n", em.ledger().table().c_str());
  return 0;
}
