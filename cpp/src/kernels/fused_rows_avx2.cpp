#define SHARDLAB_FUSED_NS avx2
#include "fused_rows_impl.hpp"
