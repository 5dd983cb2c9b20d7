// shardlab from C++ alone: the book's sharded matmuls on an emulated (x=4, y=2) mesh with
// xtensor arrays, every result checked against a plain xtensor expression, then the ledger.
//
//   1. A[I, J] sharded P(None, 'x') and B[J, K] sharded P('x', None): each device multiplies
//      its blocks; psum over x completes A @ B on every device (an AllReduce).
//   2. psum_scatter instead: each device keeps 1/4 of the rows (a ReduceScatter, half the bytes).
//   3. all_gather of those rows gives the psum's answer back.
//   4. ppermute shifts blocks one step around the x ring.
// Shards are read back through Emulator::shard: xt::adapt views into the storage, no copies.
// Exits 1 on the first mismatch (ctest runs it), 0 after printing the ledger.
#include <cstdio>
#include <iostream>
#include <string>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xio.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include "shardlab/xtensor.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%-62s %s\n", what.c_str(), ok ? "ok" : "MISMATCH");
  if (!ok) ++failures;
}

// The definition: C[i, k] = sum_j A[i, j] B[j, k], as one xtensor expression.
xt::xarray<float> reference_matmul(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  return xt::sum(xt::view(a, xt::all(), xt::all(), xt::newaxis()) * xt::view(b, xt::newaxis(), xt::all(), xt::all()),
                 {1});
}

}  // namespace

int main() {
  using shardlab::Emulator;
  using shardlab::Mesh;
  const std::int64_t I = 16, J = 32, K = 8;
  Emulator em(Mesh({"x", "y"}, {4, 2}));
  const Mesh& mesh = em.mesh();

  xt::random::seed(0);
  const xt::xarray<float> a = xt::random::randn<float>({I, J});
  const xt::xarray<float> b = xt::random::randn<float>({J, K});
  const xt::xarray<float> want = reference_matmul(a, b);

  // device_put: storage is (mesh dims..., local dims...): x splits J, y splits nothing.
  const auto a_s = em.device_put(a, {{}, {"x"}});   // (4, 1, 16, 8)
  const auto b_s = em.device_put(b, {{"x"}, {}});   // (4, 1, 8, 8)
  check(a_s.shape() == std::vector<std::size_t>{4, 1, I, J / 4}, "A's storage is (4, 1, 16, 8)");
  for (std::int64_t d = 0; d < mesh.size(); ++d) {
    const std::int64_t x = mesh.coords(d)[0];
    if (em.shard(a_s, d) != xt::view(a, xt::all(), xt::range(x * J / 4, (x + 1) * J / 4))) {
      check(false, "device " + std::to_string(d) + " holds A's columns of its x block");
    }
  }
  check(em.device_get(a_s, {{}, {"x"}}) == a, "device_get(device_put(A)) == A");

  // A shard is a view: its first element is inside the storage, at the device's offset.
  const auto s5 = em.shard(a_s, 5);  // device (x=2, y=1)
  check(&s5(0, 0) == a_s.data() + 2 * I * (J / 4), "shard(A, 5) is a view into A's storage");

  // 1. Local matmuls give partial sums over J; psum over x adds them.
  const auto partial = em.matmul(a_s, b_s);  // (4, 1, 16, 8): one partial product per x
  const auto c = em.psum(partial, {"x"});     // (1, 1, 16, 8): the same C on every device
  bool all_c = c.shape() == std::vector<std::size_t>{1, 1, I, K};
  for (std::int64_t d = 0; d < mesh.size(); ++d) all_c = all_c && xt::allclose(em.shard(c, d), want, 1e-4, 1e-4);
  check(all_c, "psum(A_x @ B_x, 'x') == A @ B on all 8 devices");

  // 2. psum_scatter: device x keeps rows [4x, 4x + 4) of C.
  const auto rows = em.psum_scatter(partial, {"x"}, 0, true);  // (4, 1, 4, 8)
  bool all_rows = true;
  for (std::int64_t d = 0; d < mesh.size(); ++d) {
    const std::int64_t x = mesh.coords(d)[0];
    all_rows = all_rows && xt::allclose(em.shard(rows, d), xt::view(want, xt::range(4 * x, 4 * x + 4), xt::all()),
                                        1e-4, 1e-4);
  }
  check(all_rows, "psum_scatter(A_x @ B_x, 'x') gives device x rows 4x..4x+3");
  check(xt::allclose(em.device_get(rows, {{"x"}, {}}), want, 1e-4, 1e-4), "device_get of the scattered rows == A @ B");

  // 3. all_gather puts the rows back together: AllGather after ReduceScatter is an AllReduce.
  const auto gathered = em.all_gather(rows, {"x"}, 0, true);  // (1, 1, 16, 8)
  check(gathered.shape() == c.shape() && xt::allclose(gathered, c, 1e-6, 1e-6), "all_gather(psum_scatter(.)) == psum(.)");

  // 4. ppermute: device x receives the block of device x - 1 (mod 4).
  const auto shifted = em.ppermute(a_s, {"x"}, {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
  bool all_shifted = true;
  for (std::int64_t d = 0; d < mesh.size(); ++d) {
    const auto xy = mesh.coords(d);
    const std::int64_t from = mesh.device_id({(xy[0] + 3) % 4, xy[1]});
    all_shifted = all_shifted && em.shard(shifted, d) == em.shard(a_s, from);
  }
  check(all_shifted, "ppermute around the x ring moves each block one step");

  // The ledger: bytes per device under the ring algorithms, V = one device's array.
  const auto& ev = em.ledger().events();
  const double v_partial = 4.0 * I * K;  // bytes of one partial product
  check(ev.size() == 5, "the ledger holds the matmul and the four collectives");
  check(ev.size() == 5 && ev[1].op == "psum" && ev[1].bytes_sent == 2.0 * 3 / 4 * v_partial,
        "psum sends 2 (n-1)/n V = 768 bytes per device");
  check(ev.size() == 5 && ev[2].op == "psum_scatter" && ev[2].bytes_sent == 3.0 / 4 * v_partial,
        "psum_scatter sends half of that");
  check(ev.size() == 5 && ev[0].flops == 2.0 * I * K * (J / 4), "each device's matmul does 2 I K J/4 FLOPs");

  std::cout << "\n" << em.ledger().table();
  if (failures) std::printf("%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
