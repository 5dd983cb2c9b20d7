// Every flash-attention path this CPU has against the materialized reference, on odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include "shardlab/attention.hpp"
#include "shardlab/cpu_features.hpp"

namespace shardlab {
namespace {

struct Case {
  int64_t B, Tq, Tk, Hq, Hkv, D;
  bool causal;
  int mask;  // 0 none, 1 random [B, Hq, Tq, Tk], 2 random broadcast [1, 1, Tq, Tk] with empty rows
};

std::vector<Isa> paths() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(detected_isa())) out.push_back(isa);
  }
  return out;
}

class IsaGuard {
 public:
  explicit IsaGuard(Isa isa) : saved_(active_isa()) { set_active_isa(isa); }
  ~IsaGuard() { set_active_isa(saved_); }

 private:
  Isa saved_;
};

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16(x[i]);
  return y;
}

double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (float v : x) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

// Compares fast and reference forward and backward for one case, in fp32 and bf16.
void check_case(const Case& c, std::mt19937& rng) {
  AttentionProblem p;
  p.batch = c.B, p.q_len = c.Tq, p.kv_len = c.Tk, p.q_heads = c.Hq, p.kv_heads = c.Hkv;
  p.head_dim = c.D;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  p.causal = c.causal;
  const size_t nq = c.B * c.Tq * c.Hq * c.D, nk = c.B * c.Tk * c.Hkv * c.D;
  const size_t nl = c.B * c.Hq * c.Tq;
  std::vector<float> q = randn(nq, rng, 1.5f), k = randn(nk, rng, 1.5f), v = randn(nk, rng);
  std::vector<float> dout = randn(nq, rng);
  std::vector<uint8_t> mask;
  if (c.mask == 1) {
    mask.resize(c.B * c.Hq * c.Tq * c.Tk);
    for (auto& m : mask) m = rng() % 4 != 0;
    p.mask_strides[0] = c.Hq * c.Tq * c.Tk, p.mask_strides[1] = c.Tq * c.Tk;
    p.mask_strides[2] = c.Tk, p.mask_strides[3] = 1;
  } else if (c.mask == 2) {
    mask.resize(c.Tq * c.Tk);
    for (auto& m : mask) m = rng() % 3 != 0;
    for (int64_t j = 0; j < c.Tk; ++j) mask[(c.Tq / 2) * c.Tk + j] = 0;  // an empty row
    p.mask_strides[2] = c.Tk, p.mask_strides[3] = 1;
  }
  p.mask = mask.empty() ? nullptr : mask.data();
  const std::string where = "B=" + std::to_string(c.B) + " Tq=" + std::to_string(c.Tq) +
                            " Tk=" + std::to_string(c.Tk) + " Hq=" + std::to_string(c.Hq) +
                            " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) +
                            " causal=" + std::to_string(c.causal) +
                            " mask=" + std::to_string(c.mask);

  std::vector<float> ro(nq), rl(nl), rdq(nq), rdk(nk), rdv(nk);
  attention_reference_forward(p, q.data(), k.data(), v.data(), ro.data(), rl.data());
  attention_reference_backward(p, q.data(), k.data(), v.data(), dout.data(), rdq.data(),
                               rdk.data(), rdv.data());
  // The floor covers gradients that vanish exactly (one key) but are computed from D-term dot
  // products that cancel (dP - delta), whose rounding grows like sqrt(D).
  const double fl = 1e-2 * std::sqrt(static_cast<double>(c.D));
  const double gq = max_abs(rdq) + fl, gk = max_abs(rdk) + fl, gv = max_abs(rdv) + fl;

  for (Isa isa : paths()) {
    IsaGuard guard(isa);
    const std::string tag = isa_name(isa) + " " + where;
    std::vector<float> o(nq), l(nl), dq(nq), dk(nk), dv(nk);
    attention_forward(p, q.data(), k.data(), v.data(), o.data(), l.data());
    for (size_t x = 0; x < nq; ++x) ASSERT_NEAR(o[x], ro[x], 2e-5) << tag << " out " << x;
    for (size_t x = 0; x < nl; ++x) {
      if (std::isinf(rl[x])) {
        ASSERT_TRUE(std::isinf(l[x]) && l[x] < 0) << tag << " lse " << x;
      } else {
        ASSERT_NEAR(l[x], rl[x], 2e-5 * (1 + std::abs(rl[x]))) << tag << " lse " << x;
      }
    }
    attention_backward(p, q.data(), k.data(), v.data(), o.data(), dout.data(), l.data(),
                       dq.data(), dk.data(), dv.data());
    for (size_t x = 0; x < nq; ++x) ASSERT_NEAR(dq[x], rdq[x], 1e-4 * gq) << tag << " dq " << x;
    for (size_t x = 0; x < nk; ++x) {
      ASSERT_NEAR(dk[x], rdk[x], 1e-4 * gk) << tag << " dk " << x;
      ASSERT_NEAR(dv[x], rdv[x], 1e-4 * gv) << tag << " dv " << x;
    }

    // bf16: inputs rounded to bf16, reference computed from the same rounded inputs; the
    // fast path keeps fp32 statistics, so only the final rounding of out (2^-8 relative)
    // separates them. Tolerance: 1/128 of max |out| (two bf16 ulps at the top of the range).
    AttentionProblem pb = p;
    pb.dtype = DType::bfloat16;
    const auto qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v), db = to_bf16(dout);
    std::vector<uint16_t> ob(nq), rob(nq);
    std::vector<float> lb(nl), rlb(nl), dqb(nq), dkb(nk), dvb(nk), rdqb(nq), rdkb(nk), rdvb(nk);
    attention_forward(pb, qb.data(), kb.data(), vb.data(), ob.data(), lb.data());
    attention_reference_forward(pb, qb.data(), kb.data(), vb.data(), rob.data(), rlb.data());
    double omax = 0.0;
    for (uint16_t x : rob) omax = std::max(omax, std::abs(double(bf16_to_float(x))));
    for (size_t x = 0; x < nq; ++x) {
      ASSERT_NEAR(bf16_to_float(ob[x]), bf16_to_float(rob[x]), omax / 128 + 1e-6)
          << tag << " bf16 out " << x;
    }
    attention_backward(pb, qb.data(), kb.data(), vb.data(), rob.data(), db.data(), rlb.data(),
                       dqb.data(), dkb.data(), dvb.data());
    attention_reference_backward(pb, qb.data(), kb.data(), vb.data(), db.data(), rdqb.data(),
                                 rdkb.data(), rdvb.data());
    // The backward sees the bf16-rounded out in delta = dout . out, hence ~1e-2 relative.
    const double tq = 2e-2 * (max_abs(rdqb) + 1e-3), tk = 2e-2 * (max_abs(rdkb) + 1e-3);
    const double tv = 1e-4 * (max_abs(rdvb) + 1e-3);
    for (size_t x = 0; x < nq; ++x) ASSERT_NEAR(dqb[x], rdqb[x], tq) << tag << " bf16 dq " << x;
    for (size_t x = 0; x < nk; ++x) {
      ASSERT_NEAR(dkb[x], rdkb[x], tk) << tag << " bf16 dk " << x;
      ASSERT_NEAR(dvb[x], rdvb[x], tv) << tag << " bf16 dv " << x;
    }
  }
}

TEST(Attention, OddSizesEveryPath) {
  const int64_t sizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 127, 129, 257};
  std::mt19937 rng(4);
  auto pick = [&] { return sizes[rng() % 16]; };
  for (int t = 0; t < 40; ++t) {
    Case c;
    c.Tq = pick(), c.Tk = pick(), c.D = pick();
    if (c.D > 129) c.D = 65;  // keeps the double-precision reference quick
    c.Hkv = 1 + rng() % 2;
    c.Hq = c.Hkv * (1 + rng() % 3);
    c.B = 1 + rng() % 2;
    c.causal = rng() % 2;
    c.mask = rng() % 3;
    check_case(c, rng);
  }
}

TEST(Attention, BlockBoundariesCausalGqa) {
  std::mt19937 rng(7);
  for (const Case& c : {Case{1, 129, 129, 4, 2, 64, true, 0}, Case{2, 65, 257, 2, 1, 16, true, 0},
                        Case{1, 257, 63, 3, 1, 33, true, 2}, Case{1, 128, 128, 2, 2, 128, false, 1},
                        Case{1, 1, 257, 1, 1, 7, true, 0},
                        // Around the AVX2 path's 144-row tiles: one past, one short, two tiles
                        // with a GQA group (the next-head prefetch), a masked uneven pair.
                        Case{1, 145, 145, 2, 1, 128, true, 0}, Case{1, 289, 289, 4, 2, 32, true, 0},
                        Case{2, 144, 287, 2, 1, 16, false, 1}, Case{1, 143, 289, 2, 2, 48, true, 2},
                        Case{1, 287, 145, 2, 1, 24, false, 0}}) {
    check_case(c, rng);
  }
}

TEST(Attention, FastExpAccuracy) {
  // exp2 error shows up directly in out for one query and two keys with a known logit gap.
  for (Isa isa : paths()) {
    IsaGuard guard(isa);
    for (float gap : {-80.0f, -3.7f, -0.3f, 0.0f, 0.45f, 5.5f}) {
      AttentionProblem p;
      p.batch = p.q_len = p.q_heads = p.kv_heads = p.head_dim = 1;
      p.kv_len = 2;
      p.scale = 1.0f;
      const float q[1] = {1.0f}, k[2] = {0.0f, gap}, v[2] = {0.0f, 1.0f};
      float o[1], l[1];
      attention_forward(p, q, k, v, o, l);
      const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(gap)));
      EXPECT_NEAR(o[0], want, 5e-7 * want + 1e-30) << isa_name(isa) << " gap " << gap;
    }
  }
}

TEST(Attention, ReferenceAndEveryPathMatchAnXtensorSoftmax) {
  // softmax(scale q k^T, causal) v per head as xtensor expressions in double (GQA: query head h
  // reads kv head h / 2): an oracle independent of the reference's loops.
  const int64_t Tq = 5, Tk = 7, Hq = 4, Hkv = 2, D = 6;
  std::mt19937 rng(21);
  const std::vector<float> q = randn(Tq * Hq * D, rng), k = randn(Tk * Hkv * D, rng), v = randn(Tk * Hkv * D, rng);
  const auto qx = xt::adapt(q, std::vector<size_t>{Tq, Hq, D});
  const auto kx = xt::adapt(k, std::vector<size_t>{Tk, Hkv, D});
  const auto vx = xt::adapt(v, std::vector<size_t>{Tk, Hkv, D});
  AttentionProblem p;
  p.batch = 1, p.q_len = Tq, p.kv_len = Tk, p.q_heads = Hq, p.kv_heads = Hkv, p.head_dim = D;
  p.scale = 0.37f;
  p.causal = true;
  xt::xarray<double> want_out = xt::zeros<double>({Tq, Hq, D}), want_lse = xt::zeros<double>({Hq, Tq});
  for (int64_t h = 0; h < Hq; ++h) {
    const xt::xarray<double> qh = xt::view(qx, xt::all(), h, xt::all());
    const xt::xarray<double> kh = xt::view(kx, xt::all(), h / 2, xt::all());
    const xt::xarray<double> vh = xt::view(vx, xt::all(), h / 2, xt::all());
    xt::xarray<double> logits = static_cast<double>(p.scale) *
                                xt::sum(xt::view(qh, xt::all(), xt::newaxis(), xt::all()) *
                                            xt::view(kh, xt::newaxis(), xt::all(), xt::all()),
                                        {2});
    const auto i = xt::view(xt::arange<int64_t>(Tq), xt::all(), xt::newaxis());
    const auto j = xt::view(xt::arange<int64_t>(Tk), xt::newaxis(), xt::all());
    logits = xt::where(j <= i, logits, -std::numeric_limits<double>::infinity());  // top-left causal
    const xt::xarray<double> top = xt::amax(logits, {1}, xt::keep_dims);
    const xt::xarray<double> w = xt::exp(logits - top);
    const xt::xarray<double> total = xt::sum(w, {1}, xt::keep_dims);
    xt::view(want_out, xt::all(), h, xt::all()) =
        xt::sum(xt::view(w / total, xt::all(), xt::all(), xt::newaxis()) * xt::view(vh, xt::newaxis(), xt::all(), xt::all()),
                {1});
    xt::view(want_lse, h, xt::all()) = xt::view(xt::log(total) + top, xt::all(), 0);
  }
  std::vector<float> o(Tq * Hq * D), l(Hq * Tq);
  attention_reference_forward(p, q.data(), k.data(), v.data(), o.data(), l.data());
  EXPECT_TRUE(xt::allclose(xt::adapt(o, want_out.shape()), want_out, 1e-5, 1e-6)) << "reference out";
  EXPECT_TRUE(xt::allclose(xt::adapt(l, want_lse.shape()), want_lse, 1e-5, 1e-6)) << "reference lse";
  for (Isa isa : paths()) {
    IsaGuard guard(isa);
    attention_forward(p, q.data(), k.data(), v.data(), o.data(), l.data());
    EXPECT_TRUE(xt::allclose(xt::adapt(o, want_out.shape()), want_out, 2e-5, 2e-5)) << isa_name(isa) << " out";
    EXPECT_TRUE(xt::allclose(xt::adapt(l, want_lse.shape()), want_lse, 2e-5, 2e-5)) << isa_name(isa) << " lse";
  }
}

TEST(Attention, RejectsBadProblems) {
  AttentionProblem p;
  p.batch = 1, p.q_len = 4, p.kv_len = 4, p.q_heads = 3, p.kv_heads = 2, p.head_dim = 8;
  std::vector<float> buf(256), lse(16);
  try {
    attention_forward(p, buf.data(), buf.data(), buf.data(), buf.data(), lse.data());
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[flash_attention] the number of query heads 3"),
              std::string::npos)
        << e.what();
  }
  p.q_heads = 2, p.head_dim = 0;
  EXPECT_THROW(attention_forward(p, buf.data(), buf.data(), buf.data(), buf.data(), lse.data()),
               std::invalid_argument);
  p.head_dim = 8, p.dtype = DType::int32;  // the core's one dtype enum has more than the kernel takes
  try {
    attention_forward(p, buf.data(), buf.data(), buf.data(), buf.data(), lse.data());
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[flash_attention] dtype int32"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardlab
