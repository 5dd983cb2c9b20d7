// A caching allocator for collective outputs. A fresh multi-megabyte allocation costs a page
// fault and a kernel zero-fill per page, which doubles the memory traffic of a copy; real
// accelerator runtimes keep device memory cached for the same reason. Freed buffers are kept
// (up to a byte cap) and handed out again for requests of the same size class.
//
// Every host allocation of the core goes through here, so this is also where its size is
// checked: an emulated mesh keeps every device's data in this machine's memory, and a request
// larger than that memory is refused with AllocationError before anything is mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlab {

// "[op] needs N GiB, more than the M GiB this machine has; <what to do>": an allocation that
// cannot fit (the bindings raise it as Python's MemoryError, with the same text as
// shardlab._src.core.memory.check_alloc).
class AllocationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Physical memory of this machine in bytes (sysconf).
double physical_memory_bytes();

// Throws AllocationError naming `op` when `bytes` exceed this machine's memory; `hint` says
// what to do instead.
void check_alloc(const char* op, double bytes, const std::string& hint = "");

// Bytes of an array of `shape` with `itemsize`-byte elements, checked by check_alloc (as a
// double first, so a shape whose byte count overflows 64 bits is refused, not wrapped).
std::size_t checked_bytes(const char* op, const std::vector<std::int64_t>& shape, std::size_t itemsize,
                          const std::string& hint = "");

// Small requests go straight to malloc; large ones are rounded up to a size class. `op` names
// the caller in the AllocationError thrown when the request cannot fit or the system refuses it.
void* pool_allocate(std::size_t bytes, const char* op = "allocate");

// std::aligned_alloc(align, bytes rounded up to align) behind check_alloc: the kernels'
// workspaces (packing buffers, attention tiles). Free with std::free.
void* aligned_allocate(const char* op, std::size_t align, std::size_t bytes);
void pool_free(void* ptr, std::size_t bytes);

// Bytes currently cached (free, ready for reuse) and the cap on them.
std::size_t pool_cached_bytes();
std::size_t pool_capacity();
void pool_set_capacity(std::size_t bytes);
// Returns every cached buffer to the system.
void pool_release();

}  // namespace shardlab
