#include "shardlab/buffer_pool.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

namespace shardlab {
namespace {

constexpr std::size_t kPooledMin = std::size_t{1} << 20;  // below 1 MiB malloc is cheap enough
constexpr std::size_t kAlign = std::size_t{1} << 21;       // 2 MiB: transparent huge pages

struct Pool {
  std::mutex mu;
  std::multimap<std::size_t, void*> free_list;  // size class -> buffers
  std::size_t cached = 0;
  std::size_t capacity = std::size_t{4} << 30;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: numpy may free buffers during interpreter exit
  return *p;
}

// Large buffers are mapped and unmapped directly, so a buffer the cache lets go returns to
// the system at once (freed through malloc it could stay in the heap, resident).
std::size_t mapped_bytes(std::size_t cls) { return (cls + kAlign - 1) / kAlign * kAlign; }

void* map_buffer(std::size_t cls) {
  void* p = mmap(nullptr, mapped_bytes(cls), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, mapped_bytes(cls), MADV_HUGEPAGE);
  return p;
}

void unmap_buffer(void* p, std::size_t cls) { munmap(p, mapped_bytes(cls)); }

// Size classes: round up to a multiple of 1/8 of the next power of two (<= 12.5% waste).
std::size_t size_class(std::size_t bytes) {
  std::size_t p = kPooledMin;
  while (p < bytes) p <<= 1;
  const std::size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

}  // namespace

void* pool_allocate(std::size_t bytes) {
  if (bytes < kPooledMin) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const std::size_t cls = size_class(bytes);
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lock(pl.mu);
    auto it = pl.free_list.find(cls);
    if (it != pl.free_list.end()) {
      void* p = it->second;
      pl.free_list.erase(it);
      pl.cached -= cls;
      return p;
    }
  }
  return map_buffer(cls);
}

void pool_free(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
  if (bytes < kPooledMin) {
    std::free(ptr);
    return;
  }
  const std::size_t cls = size_class(bytes);
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lock(pl.mu);
    if (pl.cached + cls <= pl.capacity) {
      pl.free_list.emplace(cls, ptr);
      pl.cached += cls;
      return;
    }
  }
  unmap_buffer(ptr, cls);
}

std::size_t pool_cached_bytes() {
  std::lock_guard<std::mutex> lock(pool().mu);
  return pool().cached;
}

std::size_t pool_capacity() {
  std::lock_guard<std::mutex> lock(pool().mu);
  return pool().capacity;
}

void pool_set_capacity(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(pool().mu);
    pool().capacity = bytes;
  }
  if (pool_cached_bytes() > bytes) pool_release();
}

void pool_release() {
  std::multimap<std::size_t, void*> drop;
  {
    std::lock_guard<std::mutex> lock(pool().mu);
    drop.swap(pool().free_list);
    pool().cached = 0;
  }
  for (auto& kv : drop) unmap_buffer(kv.second, kv.first);
}

}  // namespace shardlab
