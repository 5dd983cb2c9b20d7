#define SHARDLAB_ISA_NS avx512
#include "fused_rows_impl.hpp"
