// _core.gemm: numpy arrays in (no copies: strides are handed to the packing), fp32 array out.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "array_ref.hpp"
#include "shardlab/cpu_features.hpp"
#include "shardlab/gemm.hpp"

namespace py = pybind11;

namespace {

std::string shape_str(const py::array& x) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < x.ndim(); ++d) s += (d ? ", " : "") + std::to_string(x.shape(d));
  return s + (x.ndim() == 1 ? ",)" : ")");
}

shardlab::GemmType gemm_type(const py::array& x, const char* name) {
  if (x.dtype().is(py::dtype::of<float>())) return shardlab::GemmType::f32;
  if (py::str(x.dtype().attr("name")).cast<std::string>() == "bfloat16") {
    return shardlab::GemmType::bf16;
  }
  throw py::type_error(std::string("[gemm] ") + name + " has dtype " +
                       py::str(x.dtype()).cast<std::string>() +
                       "; the kernel takes float32 or bfloat16 (use np.matmul for other dtypes)");
}

// Element strides of `x`; byte strides that are not whole elements cannot be packed.
std::vector<int64_t> elem_strides(const py::array& x, const char* name) {
  std::vector<int64_t> out;
  for (py::ssize_t d = 0; d < x.ndim(); ++d) {
    if (x.strides(d) % x.itemsize() != 0) {
      throw py::value_error(std::string("[gemm] ") + name + " has byte stride " +
                            std::to_string(x.strides(d)) + " in dim " + std::to_string(d) +
                            ", not a multiple of its item size; pass np.ascontiguousarray(" +
                            name + ")");
    }
    out.push_back(x.strides(d) / x.itemsize());
  }
  return out;
}

py::array gemm(const py::array& a, const py::array& b) {
  const shardlab::GemmType type = gemm_type(a, "a");
  if (gemm_type(b, "b") != type) {
    throw py::type_error("[gemm] a has dtype " + py::str(a.dtype()).cast<std::string>() +
                         " and b " + py::str(b.dtype()).cast<std::string>() +
                         "; cast both to the same dtype");
  }
  const py::ssize_t nd = a.ndim();
  if (nd < 2 || b.ndim() != nd) {
    throw py::value_error("[gemm] a has shape " + shape_str(a) + " and b " + shape_str(b) +
                          ": both need the same rank, at least 2 (shardlab.kernels.gemm "
                          "handles 1-D operands and rank differences)");
  }
  const std::vector<int64_t> as = elem_strides(a, "a"), bs = elem_strides(b, "b");
  const int64_t m = a.shape(nd - 2), k = a.shape(nd - 1), n = b.shape(nd - 1);
  if (b.shape(nd - 2) != k) {
    throw py::value_error("[gemm] a has shape " + shape_str(a) + " and b " + shape_str(b) +
                          ": inner dimensions " + std::to_string(k) + " and " +
                          std::to_string(b.shape(nd - 2)) + " differ");
  }
  shardlab::GemmProblem p;
  p.type = type;
  p.a = {a.data(), m, k, as[nd - 2], as[nd - 1]};
  p.b = {b.data(), k, n, bs[nd - 2], bs[nd - 1]};
  std::vector<py::ssize_t> out_shape;
  for (py::ssize_t d = 0; d + 2 < nd; ++d) {
    const int64_t da = a.shape(d), db = b.shape(d);
    if (da != db && da != 1 && db != 1) {
      throw py::value_error("[gemm] batch dims of a " + shape_str(a) + " and b " + shape_str(b) +
                            " do not broadcast: dim " + std::to_string(d) + " is " +
                            std::to_string(da) + " vs " + std::to_string(db));
    }
    const int64_t size = da == 1 ? db : da;
    p.batch_shape.push_back(size);
    p.a_batch_strides.push_back(da == 1 ? 0 : as[d]);
    p.b_batch_strides.push_back(db == 1 ? 0 : bs[d]);
    out_shape.push_back(size);
  }
  out_shape.push_back(m);
  out_shape.push_back(n);
  // From the buffer pool: a fresh multi-megabyte result would page-fault on every call.
  py::array c = shardlab_py::pool_array(py::dtype::of<float>(), out_shape);
  p.c = static_cast<float*>(c.mutable_data());
  p.c_row_stride = n;
  int64_t stride = m * n;
  p.c_batch_strides.assign(p.batch_shape.size(), 0);
  for (size_t d = p.batch_shape.size(); d-- > 0;) {
    p.c_batch_strides[d] = stride;
    stride *= p.batch_shape[d];
  }
  {
    py::gil_scoped_release release;
    shardlab::gemm(p);
  }
  return c;
}

}  // namespace

void init_gemm(py::module_& m) {
  m.def("gemm", &gemm, py::arg("a"), py::arg("b"),
        "C = a @ b for float32 or bfloat16 arrays of equal rank >= 2 whose batch dims are equal "
        "or 1; returns float32. Reads any element strides without copying and releases the GIL.");
  m.def("measure_fma_peak_gflops", &shardlab::measure_fma_peak_gflops, py::arg("threads"),
        py::call_guard<py::gil_scoped_release>(),
        "fp32 AVX2 FMA peak in GFLOP/s with `threads` threads, from a register-only FMA loop "
        "(best of 5 runs, ~0.3 s): the ceiling benchmarks report the kernels against.");
}
