// _core.gemm: numpy arrays in (no copies: strides are handed to the packing), fp32 array out.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "array_ref.hpp"
#include "shardlab/cpu_features.hpp"
#include "shardlab/gemm.hpp"
#include "shardlab/matmul.hpp"

namespace py = pybind11;

namespace {

// The dtype check stays here so an unsupported dtype is a TypeError naming numpy's dtype;
// shapes and strides are checked by the core (matmul_shape, matmul_problem: ValueError).
shardlab::DType kernel_dtype(const py::array& x, const char* name) {
  // equal, not identical: an unpickled or np.load-ed array carries its own float32 dtype object
  if (x.dtype().equal(py::dtype::of<float>())) return shardlab::DType::float32;
  if (py::str(x.dtype().attr("name")).cast<std::string>() == "bfloat16") {
    return shardlab::DType::bfloat16;
  }
  throw py::type_error(std::string("[gemm] ") + name + " has dtype " +
                       py::str(x.dtype()).cast<std::string>() +
                       "; the kernel takes float32 or bfloat16 (use np.matmul for other dtypes)");
}

py::array gemm(const py::array& a, const py::array& b) {
  if (kernel_dtype(a, "a") != kernel_dtype(b, "b")) {
    throw py::type_error("[gemm] a has dtype " + py::str(a.dtype()).cast<std::string>() +
                         " and b " + py::str(b.dtype()).cast<std::string>() +
                         "; cast both to the same dtype");
  }
  const shardlab::ArrayRef ar = shardlab_py::as_ref(a), br = shardlab_py::as_ref(b);
  const shardlab::Shape out_shape = shardlab::matmul_shape(ar.shape, br.shape, "gemm");
  // From the buffer pool: a fresh multi-megabyte result would page-fault on every call.
  py::array c = shardlab_py::pool_array(
      py::dtype::of<float>(), std::vector<py::ssize_t>(out_shape.begin(), out_shape.end()), "gemm");
  const shardlab::GemmProblem p =
      shardlab::matmul_problem(ar, br, shardlab_py::as_ref(c), "gemm");
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
