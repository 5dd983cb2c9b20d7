#define SHARDLAB_ISA_NS avx2
#include "fused_rows_impl.hpp"
