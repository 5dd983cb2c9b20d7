// Placeholder until the attention module lands; replaced by its owner.
#include <pybind11/pybind11.h>
namespace py = pybind11;
void init_attention(py::module_&) {}
