#define SHARDLAB_ISA_NS avx512
#include "reduce_rows_impl.hpp"
