// Flash attention bindings: numpy arrays in (C-contiguous float32, or bfloat16 viewed as
// uint16; shardlab.kernels.attention checks and prepares them), kernels run without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "array_ref.hpp"
#include "shardlab/attention.hpp"

namespace py = pybind11;
using shardlab::DType;
using shardlab::AttentionProblem;

namespace {

DType dtype_of(const py::array& a, const char* op) {
  // equal, not identical: an unpickled or np.load-ed array carries its own dtype object
  if (a.dtype().equal(py::dtype::of<float>())) return DType::float32;
  if (a.dtype().equal(py::dtype::of<uint16_t>())) return DType::bfloat16;
  throw std::invalid_argument(std::string("[") + op + "] expected float32 or bfloat16 bits " +
                              "(uint16), got " + std::string(py::str(a.dtype())));
}

void require_c4(const py::array& a, const char* op, const char* name) {
  if (a.ndim() != 4 || !(a.flags() & py::array::c_style)) {
    throw std::invalid_argument(std::string("[") + op + "] " + name +
                                " must be a C-contiguous 4-D array");
  }
}

// q [B, Tq, Hq, D], k [B, Tk, Hkv, D]; mask (bool) already broadcast to [B, Hq, Tq, Tk].
AttentionProblem problem(const py::array& q, const py::array& k, bool causal, float scale,
                         const std::optional<py::array>& mask, const char* op) {
  require_c4(q, op, "q");
  require_c4(k, op, "k");
  AttentionProblem p;
  p.batch = q.shape(0), p.q_len = q.shape(1), p.q_heads = q.shape(2), p.head_dim = q.shape(3);
  p.kv_len = k.shape(1), p.kv_heads = k.shape(2);
  p.scale = scale;
  p.causal = causal;
  p.dtype = dtype_of(q, op);
  if (mask) {
    const py::array& m = *mask;
    if (m.ndim() != 4 || m.itemsize() != 1) {
      throw std::invalid_argument(std::string("[") + op + "] mask must be a 4-D bool array");
    }
    p.mask = static_cast<const uint8_t*>(m.data());
    for (int d = 0; d < 4; ++d) p.mask_strides[d] = m.strides(d);
  }
  return p;
}

}  // namespace

void init_attention(py::module_& m) {
  m.def(
      "attention_forward",
      [](const py::array& q, const py::array& k, const py::array& v, bool causal, float scale,
         const std::optional<py::array>& mask, bool reference) {
        const char* op = reference ? "attention_reference" : "flash_attention";
        const AttentionProblem p = problem(q, k, causal, scale, mask, op);
        require_c4(v, op, "v");
        py::array out = shardlab_py::checked_array(op, q.dtype(), std::vector<py::ssize_t>(q.shape(), q.shape() + 4));
        py::array lse = shardlab_py::checked_array(op, py::dtype::of<float>(), {p.batch, p.q_heads, p.q_len});
        const void *qp = q.data(), *kp = k.data(), *vp = v.data();
        void* op_ = out.mutable_data();
        float* lp = static_cast<float*>(lse.mutable_data());
        {
          py::gil_scoped_release release;
          if (reference) {
            shardlab::attention_reference_forward(p, qp, kp, vp, op_, lp);
          } else {
            shardlab::attention_forward(p, qp, kp, vp, op_, lp);
          }
        }
        return py::make_tuple(out, lse);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("scale"),
      py::arg("mask"), py::arg("reference") = false,
      "Flash attention forward (or the materialized reference): returns (out, lse).");
  m.def(
      "attention_backward",
      [](const py::array& q, const py::array& k, const py::array& v, const py::array& out,
         const py::array& dout, const py::array_t<float, py::array::c_style>& lse, bool causal,
         float scale, const std::optional<py::array>& mask, bool reference) {
        const char* op = reference ? "attention_reference_backward" : "flash_attention_backward";
        const AttentionProblem p = problem(q, k, causal, scale, mask, op);
        require_c4(v, op, "v");
        require_c4(out, op, "out");
        require_c4(dout, op, "dout");
        if (lse.size() != p.batch * p.q_heads * p.q_len) {
          throw std::invalid_argument(std::string("[") + op + "] lse must have B * Hq * Tq = " +
                                      std::to_string(p.batch * p.q_heads * p.q_len) +
                                      " elements, got " + std::to_string(lse.size()));
        }
        const py::dtype f32 = py::dtype::of<float>();
        py::array dq = shardlab_py::checked_array(op, f32, std::vector<py::ssize_t>(q.shape(), q.shape() + 4));
        py::array dk = shardlab_py::checked_array(op, f32, std::vector<py::ssize_t>(k.shape(), k.shape() + 4));
        py::array dv = shardlab_py::checked_array(op, f32, std::vector<py::ssize_t>(k.shape(), k.shape() + 4));
        const void *qp = q.data(), *kp = k.data(), *vp = v.data(), *o = out.data();
        const void* g = dout.data();
        const float* l = lse.data();
        float* dqp = static_cast<float*>(dq.mutable_data());
        float* dkp = static_cast<float*>(dk.mutable_data());
        float* dvp = static_cast<float*>(dv.mutable_data());
        {
          py::gil_scoped_release release;
          if (reference) {
            shardlab::attention_reference_backward(p, qp, kp, vp, g, dqp, dkp, dvp);
          } else {
            shardlab::attention_backward(p, qp, kp, vp, o, g, l, dqp, dkp, dvp);
          }
        }
        return py::make_tuple(dq, dk, dv);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("dout"), py::arg("lse"),
      py::arg("causal"), py::arg("scale"), py::arg("mask"), py::arg("reference") = false,
      "Flash attention backward (or the reference): returns fp32 (dq, dk, dv).");
}
