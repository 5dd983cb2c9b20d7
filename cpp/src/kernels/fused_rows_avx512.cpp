#define SHARDLAB_FUSED_NS avx512
#include "fused_rows_impl.hpp"
