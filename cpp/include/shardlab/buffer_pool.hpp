// A caching allocator for collective outputs. A fresh multi-megabyte allocation costs a page
// fault and a kernel zero-fill per page, which doubles the memory traffic of a copy; real
// accelerator runtimes keep device memory cached for the same reason. Freed buffers are kept
// (up to a byte cap) and handed out again for requests of the same size class.
#pragma once

#include <cstddef>

namespace shardlab {

// Small requests go straight to malloc; large ones are rounded up to a size class.
void* pool_allocate(std::size_t bytes);
void pool_free(void* ptr, std::size_t bytes);

// Bytes currently cached (free, ready for reuse) and the cap on them.
std::size_t pool_cached_bytes();
std::size_t pool_capacity();
void pool_set_capacity(std::size_t bytes);
// Returns every cached buffer to the system.
void pool_release();

}  // namespace shardlab
