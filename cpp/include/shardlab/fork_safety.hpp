// Fork safety of the kernels. Their loops run on the core's thread pool (thread_pool.hpp),
// which resets itself in a forked child; OpenMP, still used for the thread count and the
// FMA-peak loop, does not: GNU OpenMP keeps its worker threads between parallel regions and
// has no fork support, so in a child forked after the parent ran a parallel region the next
// multi-threaded region waits forever for threads that do not exist (multiprocessing's fork
// workers hang). After install_fork_handler(), a forked child runs the core on one thread (it
// lowers omp_get_max_threads() to 1, which max_threads() and so every kernel follows; a
// region that asks for a fixed number of threads > 1 is not covered): correct, serial. The
// Python extension installs it when it loads.
#pragma once

namespace shardlab {

// Registers the handler once (later calls do nothing); returns pthread_atfork's result.
int install_fork_handler();

}  // namespace shardlab
