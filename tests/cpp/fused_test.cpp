#include "shardlab/fused.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>
#include <xtensor/xarray.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>
#include <array>

#include "shardlab/cpu_features.hpp"

using namespace shardlab;

namespace {

// Every ISA this CPU can run, so the scalar, AVX2 and AVX-512 builds are each checked.
std::vector<Isa> runnable_isas() {
  std::vector<Isa> out{Isa::scalar};
  if (detected_isa() >= Isa::avx2) out.push_back(Isa::avx2);
  if (detected_isa() >= Isa::avx512) out.push_back(Isa::avx512);
  return out;
}

struct IsaGuard {
  Isa saved = active_isa();
  ~IsaGuard() { set_active_isa(saved); }
};

// |got - want| <= tol elementwise; tol is scaled by the size of the terms each result sums,
// since float cancellation (a derivative's zero, m's two terms of opposite sign) is error
// relative to those terms, not to the small result.
void expect_close(const xt::xarray<float>& got, const xt::xarray<float>& want, const xt::xarray<float>& tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want(i))) {
      EXPECT_TRUE(std::isnan(got(i))) << "at " << i;
      continue;
    }
    EXPECT_NEAR(got(i), want(i), tol(i)) << "at " << i << " of " << got.size();
  }
}

// Odd lengths (vector tails), a length over one chunk (the threaded path), wide value range.
const std::vector<std::size_t> kSizes{1, 7, 33, 1000, 70001};

}  // namespace

TEST(Fused, SiluMatchesReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    for (std::size_t n : kSizes) {
      xt::random::seed(n);
      xt::xarray<float> x = xt::random::randn<float>({n}) * 6.0f;
      xt::xarray<float> dy = xt::random::randn<float>({n});
      xt::xarray<float> y(x.shape()), y_ref(x.shape()), dx(x.shape()), dx_ref(x.shape());
      const auto len = static_cast<std::int64_t>(n);
      silu_forward(x.data(), y.data(), len);
      silu_forward_reference(x.data(), y_ref.data(), len);
      silu_backward(x.data(), dy.data(), dx.data(), len);
      silu_backward_reference(x.data(), dy.data(), dx_ref.data(), len);
      SCOPED_TRACE(isa_name(isa));
      xt::xarray<float> s = 1.0f / (1.0f + xt::exp(-x));
      expect_close(y, y_ref, 2e-6f * xt::abs(y_ref) + 1e-30f);
      expect_close(dx, dx_ref, 2e-6f * xt::abs(dy) * s * (1.0f + xt::abs(x)) + 1e-30f);
    }
  }
}

TEST(Fused, SwigluMatchesReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    for (std::size_t F : {1, 7, 33, 1000}) {
      for (std::size_t rows : {1, 5, 70}) {
        // x [2, rows, 2F] stored with its two leading dims swapped (as a matmul's permuted
        // mesh dims leave it) plus padding at the end of each row: rows at any strides.
        xt::random::seed(F * 131 + rows);
        const std::size_t pad = 3, width = 2 * F + pad;
        xt::xarray<float> store = xt::random::randn<float>({rows, std::size_t{2}, width}) * 6.0f;
        xt::xarray<float> dz = xt::random::randn<float>({std::size_t{2}, rows, F});
        const auto R = static_cast<std::int64_t>(rows), W = static_cast<std::int64_t>(width);
        const RowsView xv{store.data(), {2, R}, {W, 2 * W}};
        const RowsView dzv{dz.data(), {2 * R}, {static_cast<std::int64_t>(F)}};
        const auto Fi = static_cast<std::int64_t>(F);
        xt::xarray<float> z = xt::zeros<float>({2 * rows, F}), z_ref = z;
        xt::xarray<float> dx = xt::zeros<float>({2 * rows, 2 * F}), dx_ref = dx;
        swiglu_forward(xv, Fi, z.data());
        swiglu_forward_reference(xv, Fi, z_ref.data());
        swiglu_backward(xv, dzv, Fi, dx.data());
        swiglu_backward_reference(xv, dzv, Fi, dx_ref.data());
        SCOPED_TRACE(isa_name(isa));
        // The reference against the definition on the same rows, read with xtensor views.
        auto x = xt::view(xt::transpose(store, {1, 0, 2}), xt::all(), xt::all(), xt::range(0, 2 * F));
        xt::xarray<float> x2 = xt::reshape_view(xt::xarray<float>(x), {2 * rows, 2 * F});
        xt::xarray<float> g = xt::view(x2, xt::all(), xt::range(0, F)), u = xt::view(x2, xt::all(), xt::range(F, 2 * F));
        xt::xarray<float> s = 1.0f / (1.0f + xt::exp(-g));
        xt::xarray<float> d2 = xt::reshape_view(dz, {2 * rows, F});
        expect_close(z_ref, g * s * u, 1e-6f * xt::abs(g * s * u) + 1e-30f);
        expect_close(z, z_ref, 3e-6f * xt::abs(z_ref) + 1e-30f);
        xt::xarray<float> dg_ref = xt::view(dx_ref, xt::all(), xt::range(0, F));
        xt::xarray<float> du_ref = xt::view(dx_ref, xt::all(), xt::range(F, 2 * F));
        expect_close(du_ref, d2 * g * s, 1e-6f * xt::abs(d2 * g * s) + 1e-30f);
        expect_close(xt::xarray<float>(xt::view(dx, xt::all(), xt::range(F, 2 * F))), du_ref,
                     3e-6f * xt::abs(du_ref) + 1e-30f);
        expect_close(xt::xarray<float>(xt::view(dx, xt::all(), xt::range(0, F))), dg_ref,
                     3e-6f * xt::abs(d2 * u) * s * (1.0f + xt::abs(g)) + 1e-30f);
      }
    }
  }
}

TEST(Fused, ExpSumMatchesReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    for (std::size_t C : {1, 7, 33, 1000}) {
      const std::size_t rows = 37;
      xt::random::seed(C + 11);
      xt::xarray<float> x = xt::random::randn<float>({rows, C}) * 20.0f;
      xt::xarray<float> shift = xt::amax(x, {1}) - xt::random::rand<float>({rows}) * 3.0f;  // some x - shift > 0
      xt::xarray<float> ct = xt::random::randn<float>({rows});
      const RowsView xv{x.data(), {static_cast<std::int64_t>(rows)}, {static_cast<std::int64_t>(C)}};
      const auto Ci = static_cast<std::int64_t>(C);
      xt::xarray<float> s = xt::zeros<float>({rows}), s_ref = s;
      xt::xarray<float> dx = xt::zeros<float>({rows, C}), dx_ref = dx;
      exp_sum_forward(xv, shift.data(), Ci, s.data());
      exp_sum_forward_reference(xv, shift.data(), Ci, s_ref.data());
      exp_sum_backward(xv, shift.data(), ct.data(), Ci, dx.data());
      exp_sum_backward_reference(xv, shift.data(), ct.data(), Ci, dx_ref.data());
      SCOPED_TRACE(isa_name(isa));
      xt::xarray<float> e = xt::exp(x - xt::view(shift, xt::all(), xt::newaxis()));
      expect_close(s_ref, xt::sum(e, {1}), 1e-5f * xt::sum(e, {1}));
      expect_close(s, s_ref, 4e-6f * s_ref * 4.0f);
      expect_close(dx, dx_ref, 3e-6f * xt::abs(dx_ref) + 1e-37f);
    }
  }
}

TEST(Fused, ExpOverTheWholeFloatRange) {
  IsaGuard guard;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  xt::xarray<float> x = {-200.0f, -87.0f, -1.0f, 0.0f, 1.0f, 87.9f, 88.5f, 88.7f, 89.0f, inf, -inf, nan};
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    SCOPED_TRACE(isa_name(isa));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float zero = 0.0f, one = 1.0f;
      float dx = 0.0f;
      const RowsView xv{&x(i), {1}, {1}};
      exp_sum_backward(xv, &zero, &one, 1, &dx);
      const double want = std::exp(static_cast<double>(x(i)));
      if (std::isnan(x(i))) {
        EXPECT_TRUE(std::isnan(dx));
      } else if (want > std::numeric_limits<float>::max()) {
        EXPECT_EQ(dx, inf) << x(i);
      } else if (want < std::numeric_limits<float>::min()) {
        EXPECT_LE(dx, static_cast<float>(std::numeric_limits<float>::min())) << x(i);
      } else {
        EXPECT_NEAR(dx, want, 3e-7 * want) << x(i);
      }
    }
  }
}

TEST(Fused, SiluEdgeValues) {
  IsaGuard guard;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  xt::xarray<float> x = {0.0f, -0.0f, 1e-30f, 90.0f, -90.0f, 200.0f, -200.0f, inf, -inf, nan};
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    xt::xarray<float> y(x.shape());
    silu_forward(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    SCOPED_TRACE(isa_name(isa));
    EXPECT_EQ(y(0), 0.0f);
    EXPECT_FLOAT_EQ(y(2), 0.5e-30f);
    EXPECT_FLOAT_EQ(y(3), 90.0f);
    EXPECT_NEAR(y(4), 0.0f, 1e-30f);  // -90 * sigmoid(-90) = -7e-38
    EXPECT_EQ(y(5), 200.0f);
    EXPECT_EQ(y(6), -0.0f);
    EXPECT_EQ(y(7), inf);
    EXPECT_TRUE(std::isnan(y(8)));  // -inf * 0, as x * sigmoid(x) gives in numpy and JAX
    EXPECT_TRUE(std::isnan(y(9)));
  }
}

TEST(Fused, AdamWMatchesReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    for (std::size_t n : kSizes) {
      for (float wd : {0.0f, 0.1f}) {
        xt::random::seed(n + 1);
        xt::xarray<float> p = xt::random::randn<float>({n}), g = xt::random::randn<float>({n}) * 1e-2f;
        xt::xarray<float> m = xt::random::randn<float>({n}) * 1e-3f;
        xt::xarray<float> v = xt::abs(xt::random::randn<float>({n})) * 1e-5f;
        const AdamWStep h{1e-3f, 0.9f, 0.999f, 1e-8f, wd, 1.0f - std::pow(0.9f, 3.0f), 1.0f - std::pow(0.999f, 3.0f)};
        xt::xarray<float> p2(p.shape()), m2(p.shape()), v2(p.shape()), p3(p.shape()), m3(p.shape()), v3(p.shape());
        const auto len = static_cast<std::int64_t>(n);
        adamw_update(h, p.data(), g.data(), m.data(), v.data(), p2.data(), m2.data(), v2.data(), len);
        adamw_update_reference(h, p.data(), g.data(), m.data(), v.data(), p3.data(), m3.data(), v3.data(), len);
        SCOPED_TRACE(isa_name(isa));
        expect_close(m2, m3, 1e-6f * (h.b1 * xt::abs(m) + (1 - h.b1) * xt::abs(g)));
        expect_close(v2, v3, 1e-6f * v3);
        // The step: lr times a ratio whose size is ~1 (plus the decay term).
        expect_close(p2, p3, 1e-6f * (xt::abs(p) + h.lr * (10.0f + wd * xt::abs(p))));
      }
    }
  }
}

TEST(Fused, AdamWFirstStepMovesEachWeightByLr) {
  // From m = v = 0 the first bias-corrected step is g / |g| (eps aside): each weight moves by lr.
  xt::xarray<float> p = {1.0f, -2.0f, 3.0f}, g = {0.5f, -1e-3f, 20.0f}, zero = xt::zeros<float>({3});
  xt::xarray<float> p2(p.shape()), m2(p.shape()), v2(p.shape());
  const AdamWStep h{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f - 0.9f, 1.0f - 0.999f};
  adamw_update(h, p.data(), g.data(), zero.data(), zero.data(), p2.data(), m2.data(), v2.data(), 3);
  xt::xarray<float> want = {0.99f, -1.99f, 2.99f};
  expect_close(p2, want, xt::xarray<float>({1e-6f, 1e-5f, 1e-6f}));
  expect_close(m2, 0.1f * g, 1e-7f * xt::abs(g));
}

TEST(Fused, RmsNormMatchesReferenceOnEveryIsa) {
  IsaGuard guard;
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    for (auto [P, R, C] : std::vector<std::array<std::int64_t, 3>>{{1, 1, 1}, {1, 5, 7}, {3, 33, 65}, {2, 300, 512}}) {
      xt::random::seed(static_cast<unsigned>(P * R * C));
      const auto P_ = static_cast<std::size_t>(P), R_ = static_cast<std::size_t>(R), C_ = static_cast<std::size_t>(C);
      xt::xarray<float> x = xt::random::randn<float>({P_, R_, C_}) * 3.0f;
      xt::xarray<float> scale = xt::random::randn<float>({P_, C_});
      xt::xarray<float> dy = xt::random::randn<float>({P_, R_, C_});
      xt::xarray<float> y(x.shape()), y_ref(x.shape());
      auto r = xt::xarray<float>::from_shape({P_, R_}), r_ref = xt::xarray<float>::from_shape({P_, R_});
      rms_norm_forward(x.data(), scale.data(), 1e-6f, y.data(), r.data(), P, R, C);
      rms_norm_forward_reference(x.data(), scale.data(), 1e-6f, y_ref.data(), r_ref.data(), P, R, C);
      SCOPED_TRACE(isa_name(isa));
      expect_close(r, r_ref, 2e-6f * r_ref);
      expect_close(y, y_ref, 3e-6f * xt::abs(y_ref) + 1e-7f);
      xt::xarray<float> dx(x.shape()), dx_ref(x.shape());
      auto ds = xt::xarray<float>::from_shape({P_, C_}), ds_ref = xt::xarray<float>::from_shape({P_, C_});
      rms_norm_backward(x.data(), scale.data(), r.data(), dy.data(), dx.data(), ds.data(), P, R, C);
      rms_norm_backward_reference(x.data(), scale.data(), r.data(), dy.data(), dx_ref.data(), ds_ref.data(), P, R, C);
      // dx subtracts two terms of size ~ r |dy scale|: error relative to that
      expect_close(dx, dx_ref, 1e-5f * (xt::abs(dy) + 1.0f) * xt::abs(xt::view(scale, xt::all(), xt::newaxis(), xt::all())) *
                                   xt::view(r, xt::all(), xt::all(), xt::newaxis()) + 1e-6f);
      // dscale sums R rows: float summation error grows with R
      expect_close(ds, ds_ref, 1e-5f * static_cast<float>(R) + 1e-5f * xt::abs(ds_ref));
    }
  }
}

TEST(Fused, RmsNormBackwardDscaleDoesNotDependOnTheThreadCount) {
  // dscale sums many rows per group: the partial sums are added in row order, so one thread
  // and several give the same bits (they used to be added in the order threads finished).
  const std::int64_t P = 3, R = 2000, C = 96;  // ~35 chunks of rows, several per group
  xt::random::seed(7);
  const auto P_ = static_cast<std::size_t>(P), R_ = static_cast<std::size_t>(R), C_ = static_cast<std::size_t>(C);
  xt::xarray<float> x = xt::random::randn<float>({P_, R_, C_}), scale = xt::random::randn<float>({P_, C_});
  xt::xarray<float> dy = xt::random::randn<float>({P_, R_, C_}), y(x.shape()), dx(x.shape());
  auto r = xt::xarray<float>::from_shape({P_, R_});
  rms_norm_forward(x.data(), scale.data(), 1e-6f, y.data(), r.data(), P, R, C);
  const int saved = omp_get_max_threads();
  std::vector<xt::xarray<float>> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto ds = xt::xarray<float>::from_shape({P_, C_});
    for (int rep = 0; rep < 5; ++rep) {
      rms_norm_backward(x.data(), scale.data(), r.data(), dy.data(), dx.data(), ds.data(), P, R, C);
      results.push_back(ds);
    }
  }
  omp_set_num_threads(saved);
  for (const auto& ds : results) EXPECT_EQ(ds, results.front());
}

TEST(Fused, RmsNormOfAConstantRowIsTheScale) {
  // x = a constant row: mean(x^2) = a^2, so y = sign(a) * scale (eps aside).
  xt::xarray<float> x = xt::full_like(xt::xarray<float>::from_shape({1, 2, 4}), -2.0f);
  xt::xarray<float> scale = {{1.0f, 2.0f, 3.0f, 4.0f}};
  xt::xarray<float> y(x.shape());
  auto r = xt::xarray<float>::from_shape({1, 2});
  rms_norm_forward(x.data(), scale.data(), 0.0f, y.data(), r.data(), 1, 2, 4);
  xt::xarray<float> want = {{{-1.0f, -2.0f, -3.0f, -4.0f}, {-1.0f, -2.0f, -3.0f, -4.0f}}};
  expect_close(y, want, xt::xarray<float>(xt::full_like(want, 1e-6f)));
  expect_close(r, xt::xarray<float>({{0.5f, 0.5f}}), xt::xarray<float>({{1e-7f, 1e-7f}}));
}

TEST(Fused, RotaryMatchesReferenceAndInverseUndoesIt) {
  IsaGuard guard;
  for (Isa isa : runnable_isas()) {
    set_active_isa(isa);
    for (auto [P, B, T, N, H, half] : std::vector<std::array<std::int64_t, 6>>{
             {1, 1, 1, 1, 2, 1}, {2, 3, 5, 2, 9, 3}, {1, 2, 33, 4, 64, 32}, {8, 4, 128, 2, 64, 32}}) {
      auto u = [](std::int64_t v) { return static_cast<std::size_t>(v); };
      xt::random::seed(static_cast<unsigned>(P * B * T * N * H));
      xt::xarray<float> x = xt::random::randn<float>({u(P), u(B), u(T), u(N), u(H)});
      xt::xarray<float> ang = xt::random::rand<float>({u(P), u(T), u(half)}) * 6.0f;
      xt::xarray<float> c = xt::cos(ang), s = xt::sin(ang);
      xt::xarray<float> y(x.shape()), y_ref(x.shape()), back(x.shape());
      rotary_embedding(x.data(), c.data(), s.data(), y.data(), false, P, B, T, N, H, half);
      rotary_embedding_reference(x.data(), c.data(), s.data(), y_ref.data(), false, P, B, T, N, H, half);
      SCOPED_TRACE(isa_name(isa));
      expect_close(y, y_ref, 2e-6f * (xt::abs(x) + 1.0f));
      rotary_embedding(y.data(), c.data(), s.data(), back.data(), true, P, B, T, N, H, half);
      expect_close(back, x, 4e-6f * (xt::abs(x) + 1.0f));  // a rotation's inverse is its transpose
    }
  }
}
