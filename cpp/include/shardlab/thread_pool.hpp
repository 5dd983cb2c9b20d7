// Parallel loops of the core's memory-bound kernels and GEMM driver, on a pool of worker
// threads that never makes the caller wait for a thread that has not started work.
//
// Why not an OpenMP `parallel for`: every region ends in a barrier that waits for every
// thread of the team. When another process takes a core, the OS deschedules one team thread
// for a time slice (milliseconds) and every region waits for it, even a 50-microsecond copy
// it would have had no part in: with a busy loop on one of this machine's two cores, the
// training step went from 1.06 s to 2.4 s, slower than on one thread. Here the caller runs
// every index no worker has claimed and waits only for indices already claimed, so a
// descheduled worker costs at most the index it holds.
//
//   shardlab::parallel_for(chunks, shardlab::max_threads(), [&](std::int64_t c) { ... });
//   shardlab::parallel_for_runs(n, 4096, shardlab::max_threads(),
//                               [&](std::int64_t lo, std::int64_t hi) { ... });  // [lo, hi) runs
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace shardlab {

// The thread count the kernels use: omp_get_max_threads() (OMP_NUM_THREADS,
// omp_set_num_threads; 1 in a child forked after the core ran, see fork_safety.hpp).
int max_threads();

namespace pool_detail {
using IndexFn = void (*)(void* body, std::int64_t i);
void run(std::int64_t n, int threads, IndexFn fn, void* body);
}  // namespace pool_detail

// Calls body(i) once for every i in [0, n), on up to `threads` threads including the caller,
// and returns when every call has returned (rethrowing the first exception one threw).
// Indices are handed out one at a time in increasing order, so each should be a piece of
// work worth a few microseconds at least. Runs serially on the calling thread for threads <= 1,
// n == 1, inside another parallel_for, and when another thread's loop holds the pool.
template <class Body>
void parallel_for(std::int64_t n, int threads, Body&& body) {
  if (n <= 0) return;
  using B = std::remove_reference_t<Body>;
  pool_detail::run(n, threads, [](void* b, std::int64_t i) { (*static_cast<B*>(b))(i); },
                   const_cast<void*>(static_cast<const void*>(&body)));
}

// body(lo, hi) for the runs [0, per), [per, 2 per), ... that cover [0, n), the last one shorter:
// parallel_for over runs of `per` indices (per < 1 counts as 1).
template <class Body>
void parallel_for_runs(std::int64_t n, std::int64_t per, int threads, Body&& body) {
  if (n <= 0) return;
  per = std::max<std::int64_t>(per, 1);
  parallel_for((n + per - 1) / per, threads,
               [&](std::int64_t r) { body(r * per, std::min(n, (r + 1) * per)); });
}

}  // namespace shardlab
