#define SHARDLAB_REDUCE_ROWS_NAME reduce_rows_avx2
#include "reduce_rows_impl.hpp"
