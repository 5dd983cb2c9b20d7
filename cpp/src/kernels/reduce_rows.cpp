#define SHARDLAB_ISA_NS scalar
#include "reduce_rows_impl.hpp"
