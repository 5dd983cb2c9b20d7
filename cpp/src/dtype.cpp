#include "shardlab/dtype.hpp"

#include <stdexcept>

namespace shardlab {

std::size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::bfloat16: return 2;
    case DType::int32: return 4;
    case DType::int8: return 1;
    case DType::bool_: return 1;
  }
  return 0;
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
    case DType::int8: return "int8";
    case DType::bool_: return "bool";
  }
  return "unknown";
}

DType parse_dtype(const std::string& name) {
  for (DType d : {DType::float32, DType::float64, DType::bfloat16, DType::int32, DType::int8,
                  DType::bool_}) {
    if (dtype_name(d) == name) return d;
  }
  throw std::invalid_argument("[dtype] unsupported dtype '" + name +
                              "'; shardlab moves float32, float64, bfloat16, int32, int8 and bool");
}

}  // namespace shardlab
