#define SHARDLAB_ISA_NS scalar
#include "fused_rows_impl.hpp"
