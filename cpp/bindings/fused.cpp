// Bindings of the fused elementwise kernels (shardlab/fused.hpp): float32 C-contiguous arrays
// in, new arrays from the buffer pool out.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "array_ref.hpp"
#include "shardlab/fused.hpp"

namespace py = pybind11;
using shardlab_py::as_ref;
using shardlab_py::empty_like_dtype;

namespace {

const float* float32_data(const char* op, const char* name, const py::array& a) {
  if (a.dtype().num() != 11 || !(a.flags() & py::array::c_style)) {
    throw std::invalid_argument(std::string("[") + op + "] " + name +
                                " must be a C-contiguous float32 array; got dtype " +
                                std::string(py::str(a.dtype())));
  }
  return static_cast<const float*>(a.data());
}

void same_shape(const char* op, const py::array& a, const py::array& b) {
  const auto ra = as_ref(a), rb = as_ref(b);
  if (ra.shape != rb.shape) {
    throw std::invalid_argument(std::string("[") + op + "] shapes differ: " + shardlab::shape_str(ra.shape) +
                                " and " + shardlab::shape_str(rb.shape));
  }
}

// float32_data of `a`, which must also have the shape of `like` (the operand it pairs with).
const float* float32_like(const char* op, const char* name, const py::array& a, const py::array& like) {
  const float* p = float32_data(op, name, a);
  same_shape(op, like, a);
  return p;
}

float* out_data(py::array& a) { return static_cast<float*>(a.mutable_data()); }

// x's shape without its last dim, which a per-row operand (`shift`) must have.
shardlab::Shape row_shape(const char* op, const py::array& x, const py::array& shift) {
  const auto shape = as_ref(x).shape;
  const shardlab::Shape rows(shape.begin(), shape.empty() ? shape.end() : shape.end() - 1);
  if (shape.empty() || as_ref(shift).shape != rows) {
    throw std::invalid_argument(std::string("[") + op + "] x has shape " + shardlab::shape_str(shape) + " and shift " +
                                shardlab::shape_str(as_ref(shift).shape) + "; shift must be x's without the last dim");
  }
  return rows;
}

// A float32 array whose last dim is contiguous, as rows at any strides (no copy).
shardlab::RowsView rows_view(const char* op, const char* name, const py::array& a) {
  const auto r = as_ref(a);
  const bool last_ok = r.shape.empty() || r.shape.back() <= 1 || r.strides.back() == 4;
  bool aligned = true;
  for (auto st : r.strides) aligned = aligned && st % 4 == 0;
  if (a.dtype().num() != 11 || !last_ok || !aligned) {
    throw std::invalid_argument(std::string("[") + op + "] " + name +
                                " must be a float32 array with a contiguous last dim; got dtype " +
                                std::string(py::str(a.dtype())));
  }
  shardlab::RowsView v{static_cast<const float*>(a.data()), {}, {}};
  for (std::size_t d = 0; d + 1 < r.shape.size(); ++d) {
    v.shape.push_back(r.shape[d]);
    v.strides.push_back(r.strides[d] / 4);
  }
  return v;
}

}  // namespace

void init_fused(py::module_& m) {
  m.def("silu_forward", [](const py::array& x) {
    const float* xp = float32_data("silu", "x", x);
    py::array y = empty_like_dtype(x, as_ref(x).shape, "silu");
    float* yp = out_data(y);
    const auto n = static_cast<std::int64_t>(x.size());
    {
      py::gil_scoped_release release;
      shardlab::silu_forward(xp, yp, n);
    }
    return y;
  }, py::arg("x"), "x * sigmoid(x), one pass.");
  m.def("silu_backward", [](const py::array& x, const py::array& dy) {
    const float* xp = float32_data("silu_vjp", "x", x);
    const float* dyp = float32_like("silu_vjp", "dy", dy, x);
    py::array dx = empty_like_dtype(x, as_ref(x).shape, "silu_vjp");
    float* dxp = out_data(dx);
    const auto n = static_cast<std::int64_t>(x.size());
    {
      py::gil_scoped_release release;
      shardlab::silu_backward(xp, dyp, dxp, n);
    }
    return dx;
  }, py::arg("x"), py::arg("dy"), "dy * s * (1 + x (1 - s)), s = sigmoid(x): silu's vjp, one pass.");
  m.def("swiglu_forward", [](const py::array& x) {
    const shardlab::RowsView xv = rows_view("swiglu", "x", x);
    const auto shape = as_ref(x).shape;
    if (shape.empty() || shape.back() % 2) {
      throw std::invalid_argument("[swiglu] x has shape " + shardlab::shape_str(shape) +
                                  "; its last dim must hold [gate | up], an even size");
    }
    const std::int64_t F = shape.back() / 2;
    auto zshape = shape;
    zshape.back() = F;
    py::array z = empty_like_dtype(x, zshape, "swiglu");
    float* zp = out_data(z);
    {
      py::gil_scoped_release release;
      shardlab::swiglu_forward(xv, F, zp);
    }
    return z;
  }, py::arg("x"), "silu(x[..., :F]) * x[..., F:], one pass (rows of x at any strides).");
  m.def("swiglu_backward", [](const py::array& x, const py::array& dz) {
    const char* op = "swiglu_vjp";
    const shardlab::RowsView xv = rows_view(op, "x", x), dzv = rows_view(op, "dz", dz);
    auto shape = as_ref(x).shape;
    const auto dshape = as_ref(dz).shape;
    if (shape.empty() || shape.back() % 2 || dshape.size() != shape.size() ||
        !std::equal(shape.begin(), shape.end() - 1, dshape.begin()) || dshape.back() * 2 != shape.back()) {
      throw std::invalid_argument("[swiglu_vjp] x has shape " + shardlab::shape_str(shape) + " and dz " +
                                  shardlab::shape_str(dshape) + "; dz must be x's shape with half its last dim");
    }
    py::array dx = empty_like_dtype(x, shape, op);
    float* dxp = out_data(dx);
    {
      py::gil_scoped_release release;
      shardlab::swiglu_backward(xv, dzv, shape.back() / 2, dxp);
    }
    return dx;
  }, py::arg("x"), py::arg("dz"), "d x of silu(x[..., :F]) * x[..., F:], one pass.");
  m.def("exp_sum_forward", [](const py::array& x, const py::array& shift) {
    const char* op = "exp_sum";
    const shardlab::RowsView xv = rows_view(op, "x", x);
    const float* sp = float32_data(op, "shift", shift);
    const auto shape = as_ref(x).shape;
    const shardlab::Shape rows = row_shape(op, x, shift);
    py::array s = empty_like_dtype(x, rows, op);
    float* out = out_data(s);
    {
      py::gil_scoped_release release;
      shardlab::exp_sum_forward(xv, sp, shape.back(), out);
    }
    return s;
  }, py::arg("x"), py::arg("shift"), "sum(exp(x - shift[..., None]), axis=-1), one pass.");
  m.def("exp_sum_backward", [](const py::array& x, const py::array& shift, const py::array& ct) {
    const char* op = "exp_sum_vjp";
    const shardlab::RowsView xv = rows_view(op, "x", x);
    const float* sp = float32_data(op, "shift", shift);
    const float* cp = float32_like(op, "ct", ct, shift);
    const auto shape = as_ref(x).shape;
    const shardlab::Shape rows = row_shape(op, x, shift);
    py::array dx = empty_like_dtype(x, shape, op);
    float* out = out_data(dx);
    {
      py::gil_scoped_release release;
      shardlab::exp_sum_backward(xv, sp, cp, shape.back(), out);
    }
    return dx;
  }, py::arg("x"), py::arg("shift"), py::arg("ct"), "ct[..., None] * exp(x - shift[..., None]), one pass.");
  m.def("rms_norm_forward", [](const py::array& x, const py::array& scale, float eps) {
    const char* op = "rms_norm";
    const float* xp = float32_data(op, "x", x);
    const float* sp = float32_data(op, "scale", scale);
    const auto xs = as_ref(x).shape, ss = as_ref(scale).shape;
    if (xs.size() != 3 || ss.size() != 2 || ss[0] != xs[0] || ss[1] != xs[2]) {
      throw std::invalid_argument("[rms_norm] expects x [P, R, C] and scale [P, C]; got " + shardlab::shape_str(xs) +
                                  " and " + shardlab::shape_str(ss));
    }
    py::array y = empty_like_dtype(x, xs, op), rstd = empty_like_dtype(x, {xs[0], xs[1]}, op);
    float *yp = out_data(y), *rp = out_data(rstd);
    {
      py::gil_scoped_release release;
      shardlab::rms_norm_forward(xp, sp, eps, yp, rp, xs[0], xs[1], xs[2]);
    }
    return py::make_tuple(y, rstd);
  }, py::arg("x"), py::arg("scale"), py::arg("eps"), "(y, rstd): RMSNorm over the last dim of x [P, R, C].");
  m.def("rms_norm_backward", [](const py::array& x, const py::array& scale, const py::array& rstd,
                                const py::array& dy) {
    const char* op = "rms_norm_vjp";
    const float* xp = float32_data(op, "x", x);
    const float* sp = float32_data(op, "scale", scale);
    const float* rp = float32_data(op, "rstd", rstd);
    const float* dyp = float32_like(op, "dy", dy, x);
    const auto xs = as_ref(x).shape, ss = as_ref(scale).shape, rs = as_ref(rstd).shape;
    if (xs.size() != 3 || ss != shardlab::Shape{xs[0], xs[2]} || rs != shardlab::Shape{xs[0], xs[1]}) {
      throw std::invalid_argument("[rms_norm_vjp] expects x [P, R, C], scale [P, C] and rstd [P, R]; got " +
                                  shardlab::shape_str(xs) + ", " + shardlab::shape_str(ss) + " and " +
                                  shardlab::shape_str(rs));
    }
    py::array dx = empty_like_dtype(x, xs, op), dscale = empty_like_dtype(x, ss, op);
    float *dxp = out_data(dx), *dsp = out_data(dscale);
    {
      py::gil_scoped_release release;
      shardlab::rms_norm_backward(xp, sp, rp, dyp, dxp, dsp, xs[0], xs[1], xs[2]);
    }
    return py::make_tuple(dx, dscale);
  }, py::arg("x"), py::arg("scale"), py::arg("rstd"), py::arg("dy"), "(dx, dscale): the vjp of rms_norm_forward.");
  m.def("rotary_embedding", [](const py::array& x, const py::array& cos, const py::array& sin, bool inverse) {
    const char* op = "rotary_embedding";
    const float* xp = float32_data(op, "x", x);
    const float* cp = float32_data(op, "cos", cos);
    const float* sp = float32_like(op, "sin", sin, cos);
    const auto xs = as_ref(x).shape, cs = as_ref(cos).shape;
    if (xs.size() != 5 || cs.size() != 3 || cs[0] != xs[0] || cs[1] != xs[2] || 2 * cs[2] > xs[4]) {
      throw std::invalid_argument("[rotary_embedding] expects x [P, B, T, N, H] and cos, sin [P, T, half] with "
                                  "2 half <= H; got " + shardlab::shape_str(xs) + " and " + shardlab::shape_str(cs));
    }
    py::array out = empty_like_dtype(x, xs, op);
    float* op_ = out_data(out);
    {
      py::gil_scoped_release release;
      shardlab::rotary_embedding(xp, cp, sp, op_, inverse, xs[0], xs[1], xs[2], xs[3], xs[4], cs[2]);
    }
    return out;
  }, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("inverse") = false,
     "Rotary embedding (rotate-half layout); inverse=True rotates by minus the angle.");
  m.def("adamw_update", [](const py::array& p, const py::array& g, const py::array& mom, const py::array& v,
                           float lr, float b1, float b2, float eps, float weight_decay, float c1, float c2) {
    const char* op = "adamw_update";
    const float* pp = float32_data(op, "param", p);
    const float* gp = float32_like(op, "grad", g, p);
    const float* mp = float32_like(op, "m", mom, p);
    const float* vp = float32_like(op, "v", v, p);
    const auto shape = as_ref(p).shape;
    // numpy's own allocations, not the buffer pool: the new states outlive the step, and the
    // pool would keep the previous step's freed states cached (resident) beside them.
    const std::vector<py::ssize_t> dims(shape.begin(), shape.end());
    shardlab::checked_bytes(op, shape, 3 * sizeof(float));  // the three new states
    py::array p2 = py::array_t<float>(dims), m2 = py::array_t<float>(dims), v2 = py::array_t<float>(dims);
    float *p2p = out_data(p2), *m2p = out_data(m2), *v2p = out_data(v2);
    const shardlab::AdamWStep h{lr, b1, b2, eps, weight_decay, c1, c2};
    const auto n = static_cast<std::int64_t>(p.size());
    {
      py::gil_scoped_release release;
      shardlab::adamw_update(h, pp, gp, mp, vp, p2p, m2p, v2p, n);
    }
    return py::make_tuple(p2, m2, v2);
  }, py::arg("param"), py::arg("grad"), py::arg("m"), py::arg("v"), py::kw_only(), py::arg("lr"), py::arg("b1"),
     py::arg("b2"), py::arg("eps"), py::arg("weight_decay"), py::arg("c1"), py::arg("c2"),
     "One AdamW step (new param, m, v); c1 = 1 - b1**t and c2 = 1 - b2**t.");
}
