#include "shardlab/fork_safety.hpp"

#include <omp.h>
#include <pthread.h>

namespace shardlab {

int install_fork_handler() {
  static const int result = pthread_atfork(nullptr, nullptr, [] { omp_set_num_threads(1); });
  return result;
}

}  // namespace shardlab
