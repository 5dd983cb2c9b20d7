#define SHARDLAB_FUSED_NS scalar
#include "fused_rows_impl.hpp"
