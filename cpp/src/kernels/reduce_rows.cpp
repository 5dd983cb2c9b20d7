#define SHARDLAB_REDUCE_ROWS_NAME reduce_rows_scalar
#include "reduce_rows_impl.hpp"
