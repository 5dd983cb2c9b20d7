#define SHARDLAB_ISA_NS avx2
#include "reduce_rows_impl.hpp"
